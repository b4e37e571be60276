"""The publish half of the client's ``Publisher`` for the unit tests' fake channels.

``PublishRecorder.publish`` and ``publish_now`` have the client's signatures; a fake says
what the broker answers to each publish in ``answer`` (``publish_now`` hears it from a task
of the fake's, as the client hears it from the frame handler). An exception answer is
raised, as the client raises.
The publish gate's probe (``sidecar.flow.publish_gate``) is confirmed at once and only counted
(``probes``): the fakes' scripts answer the copies.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.errors import ChannelLostError
from sidecar.flow.publish_gate import PROBE_ROUTING_KEY
from sidecar.wire import Body, PublishOutcome, UndecodableTable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.amqp import BodyStream

Answer = PublishOutcome | Exception
_ANSWERING: set[asyncio.Task[None]] = set()  # publish_now's answers on their way


def _never_slow() -> None:
    """A publish made without waiting has no slow callback: the settler sweeps for it."""


@dataclass(frozen=True)
class Publish:
    """One publish as the fake received it."""

    body: Body
    exchange: str
    routing_key: str
    properties: dict[str, Any]
    headers: dict[str, Any]
    slow_after_s: float
    on_slow: Callable[[], None]
    content_header: bytes | None

    def as_dict(self) -> dict[str, Any]:
        """The publish's fields by name."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _received(
    body: Body,
    exchange: str,
    routing_key: str,
    properties: Mapping[str, Any],
    *,
    headers: Any,
    content_header: bytes | None,
    slow_after_s: float,
    on_slow: Callable[[], None],
) -> Publish:
    """Return a publish as the fake received it (an undecodable table: no headers)."""
    return Publish(
        body,
        exchange,
        routing_key,
        dict(properties),
        {} if isinstance(headers, UndecodableTable) else dict(headers or {}),
        slow_after_s,
        on_slow,
        content_header,
    )


class PublishRecorder:
    """Gives a fake the client's ``publish``; the fake answers in :meth:`answer`."""

    probes: int = 0  # the publish gate's probes it confirmed

    async def publish(
        self,
        body: Body,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, Any],
        headers: Any,  # a mapping, an undecodable table or None, as the client takes
        slow_after_s: float,
        on_slow: Callable[[], None],
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Hand the publish to ``answer``; raise its answer if that is an exception."""
        if routing_key == PROBE_ROUTING_KEY and exchange == "":
            self.probes += 1
            return PublishOutcome.CONFIRMED
        answer = await self.answer(
            _received(
                body,
                exchange,
                routing_key,
                properties,
                headers=headers,
                content_header=content_header,
                slow_after_s=slow_after_s,
                on_slow=on_slow,
            )
        )
        if isinstance(answer, Exception):
            raise answer
        return answer

    is_open: bool = True
    is_flowing: bool = True

    def publish_now(
        self,
        body: Body,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, Any],
        headers: Any,
        settled: Callable[[PublishOutcome | BaseException], None],
        content_header: bytes | None = None,
    ) -> bool:
        """Hand the publish to ``answer`` from a task; ``settled`` hears what it says."""
        if not self.is_open or not self.is_flowing:
            return False
        publish = _received(
            body,
            exchange,
            routing_key,
            properties,
            headers=headers,
            content_header=content_header,
            slow_after_s=math.inf,
            on_slow=_never_slow,
        )
        task = asyncio.get_running_loop().create_task(self._answer_to(publish, settled))
        _ANSWERING.add(task)
        task.add_done_callback(_ANSWERING.discard)
        return True

    async def _answer_to(
        self, publish: Publish, settled: Callable[[PublishOutcome | BaseException], None]
    ) -> None:
        try:
            answer = await self.answer(publish)
        except Exception as e:  # noqa: BLE001 - the client tells the channel's error
            settled(e)
            return
        settled(answer)

    async def publish_through(
        self,
        stream: BodyStream,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, Any],
        headers: Any,
        slow_after_s: float,
        on_slow: Callable[[], None],
    ) -> PublishOutcome:
        """Take the body's frames as a broker does; then answer as ``publish`` would."""
        received = bytearray()
        ended: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def sink(payload: memoryview) -> bool:
            received.extend(payload)
            return True

        stream.take(sink, on_end=ended.set_result)
        if not await ended:
            raise ChannelLostError("the body passing through was cut off")
        return await self.publish(
            bytes(received),
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            slow_after_s=slow_after_s,
            on_slow=on_slow,
        )

    async def answer(self, publish: Publish) -> Answer:
        """What the broker answers to ``publish``."""
        raise NotImplementedError
