"""One in-memory fake broker for the unit tests: it implements the client's Protocols."""

from tests.fakes.broker import FakeBroker, FakeConnection
from tests.fakes.channel import FakeChannel
from tests.fakes.consuming import Subscription
from tests.fakes.publish import Answer, Publish, PublishRecorder

__all__ = [
    "Answer",
    "FakeBroker",
    "FakeChannel",
    "FakeConnection",
    "Publish",
    "PublishRecorder",
    "Subscription",
]
