"""The publish half of the fake broker, under the name the publish lane's tests import."""

from tests.fakes.publish import Answer, Publish, PublishRecorder

__all__ = ["Answer", "Publish", "PublishRecorder"]
