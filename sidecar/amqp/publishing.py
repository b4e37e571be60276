"""Publishing on a channel in confirm mode: mandatory, each publish settled by the broker.

A publish's frames are made by :mod:`sidecar.wire.frames` (a large body's in parts,
views of it, never joined) and written by the link; its confirm, nack or return comes back
through :class:`~sidecar.amqp.confirms.Confirms`. A body passing through
(:mod:`sidecar.amqp.stream`) is published with its method and header first, then its frames
as the channel it arrives on reads them; until its last frame the channel carries nothing
else, and our own close then would cut the message in two, so it drops the connection
instead. While the broker pauses the channel (``channel.flow``), a publish waits unsent.
:class:`~sidecar.amqp.channel.Channel` adds the consuming and the acks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.amqp.confirms import Confirms
from sidecar.amqp.lifecycle import ChannelLife, ChannelState
from sidecar.amqp.stream import PassOn
from sidecar.errors import ChannelLostError, WireError
from sidecar.wire import UndecodableTable, publish_frames, publish_parts
from sidecar.wire import content_header as encode_content_header

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sidecar.amqp.confirms import Settled
    from sidecar.amqp.lifecycle import ChannelLink
    from sidecar.amqp.stream import BodyStream
    from sidecar.wire import Body, FieldValue, PropertyValue, PublishOutcome

__all__ = ["WHOLE_BODY_MAX", "PublishingChannel"]

# A publish whose body is larger than this is written in parts (views of the body) rather
# than joined into one bytes object with its frames: a second copy of the body.
WHOLE_BODY_MAX = 65_536


class PublishingChannel(ChannelLife):
    """A channel's publishing: mandatory, with confirms; see the module docstring."""

    def __init__(self, link: ChannelLink, number: int) -> None:
        super().__init__(link, number)
        self._confirms = Confirms(link.loop, match_header=link.match_header)
        self._pass_on = PassOn(link, number, is_open=lambda: self.state is ChannelState.OPEN)

    async def publish(
        self,
        body: Body,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue] | UndecodableTable | None,
        slow_after_s: float,
        on_slow: Callable[[], None],
        content_header: bytes | None = None,
    ) -> PublishOutcome:
        """Publish mandatory and wait for the broker's confirm; never a fire-and-forget.

        ``content_header`` (a delivery's, for the same body) is sent instead of encoding
        ``properties`` and ``headers``, which must then be what it holds.

        There is no give-up timeout: a publish already sent may still be confirmed, so
        sending it again would duplicate it. After ``slow_after_s`` ``on_slow`` is called
        once, and the wait goes on until the confirm, a nack, a return or the channel's end;
        while the broker pauses the channel (``channel.flow``) the publish waits unsent.
        Raises :class:`WireError` before sending anything when the wire cannot carry it
        (a received content header over our frame size too: the broker would close the
        connection for it).
        """
        header, data, matched = _publish_frames(
            self.number,
            self._link.match_header,
            self._link.frame_max,
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            content_header=content_header,
        )
        return await self._send(
            data,
            exchange=exchange,
            routing_key=routing_key,
            header=header,
            body=body,
            matched=matched,
            slow_after_s=slow_after_s,
            on_slow=on_slow,
        )

    def publish_now(
        self,
        body: Body,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue] | UndecodableTable | None,
        settled: Settled,
        content_header: bytes | None = None,
    ) -> bool:
        """Publish mandatory now, with no coroutine, future or timer; ``settled`` hears how.

        The common case of ``publish``: False, with nothing written, when the channel is
        not open or the broker pauses it (``publish`` waits then). Raises
        :class:`WireError` before writing, as ``publish`` does. ``settled`` is called once,
        from the frame handler, with the outcome or the error the channel ended with.
        """
        if not self.is_open or not self.is_flowing:
            return False
        header, data, matched = _publish_frames(
            self.number,
            self._link.match_header,
            self._link.frame_max,
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            content_header=content_header,
        )
        self._confirms.track_call(
            settled,
            exchange=exchange,
            routing_key=routing_key,
            header=header,
            body=body,
            matched=matched,
        )
        self._link.write(data)
        return True

    async def publish_through(
        self,
        stream: BodyStream,
        *,
        exchange: str,
        routing_key: str,
        properties: Mapping[str, PropertyValue],
        headers: Mapping[str, FieldValue] | UndecodableTable | None,
        slow_after_s: float,
        on_slow: Callable[[], None],
    ) -> PublishOutcome:
        """Publish mandatory a body passing through, its frames written on as they come.

        As ``publish`` does, it waits for the confirm, never gives up, and raises
        :class:`WireError` before sending anything the wire cannot carry. The stream is
        taken once the method and header are written; the channel carries nothing else
        until its last frame. A stream cut off on its way drops this connection: the
        broker discards the message begun, and its delivery is redelivered.
        """
        if self._pass_on.stream is not None:
            raise RuntimeError(f"channel {self.number} is already passing a body through")
        header, data, matched = _publish_frames(
            self.number,
            self._link.match_header,
            self._link.frame_max,
            b"",
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            headers=headers,
            content_header=None,
            body_size=stream.size,
        )
        return await self._send(
            data,
            exchange=exchange,
            routing_key=routing_key,
            header=header,
            body=b"",
            matched=matched,
            slow_after_s=slow_after_s,
            on_slow=on_slow,
            stream=stream,
        )

    async def _send(
        self,
        data: bytes | list[bytes | memoryview],
        *,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: Body,
        matched: object,
        slow_after_s: float,
        on_slow: Callable[[], None],
        stream: BodyStream | None = None,
    ) -> PublishOutcome:
        """Write a publish's frames once the channel flows; return the broker's settlement."""
        if not self.is_open:
            raise self._refusal()
        slow = self._loop.call_later(slow_after_s, on_slow)
        try:
            if not self.is_flowing:
                await self.wait_flowing()
                if not self.is_open:
                    raise self._refusal()
            if stream is not None and stream.ended is False:
                raise ChannelLostError("the channel the body came on closed before it came")
            future = self._confirms.track(
                exchange=exchange,
                routing_key=routing_key,
                header=header,
                body=body,
                matched=matched,
                through=0 if stream is None else stream.size,
            )
            self._link.write(data)  # a large body's in parts, never joined
            if stream is not None:
                self._pass_on.start(stream)
            return await future
        finally:
            slow.cancel()


def _publish_frames(
    number: int,
    match_header: str | None,
    frame_max: int,
    body: Body,
    *,
    exchange: str,
    routing_key: str,
    properties: Mapping[str, PropertyValue],
    headers: Mapping[str, FieldValue] | UndecodableTable | None,
    content_header: bytes | None,
    body_size: int | None = None,
) -> tuple[bytes, bytes | list[bytes | memoryview], object]:
    """Return a publish's content header, its frames, and its match header's value.

    The frames of a body over ``WHOLE_BODY_MAX`` are parts whose body frames are views of
    ``body``: the body is not copied on its way to the socket.

    ``content_header`` is sent as it is when given; else ``properties`` and ``headers`` are
    encoded, announcing ``body_size`` (a body passing through) or ``body``'s. Raises
    :class:`WireError` when the header does not fit in one frame.
    """
    if content_header is None:
        size = len(body) if body_size is None else body_size
        content_header = encode_content_header(
            properties, headers, body_size=size, frame_max=frame_max
        )
    elif len(content_header) > frame_max - 8:
        raise WireError(
            f"the message's content header takes {len(content_header)} bytes, over the"
            f" broker's frame size of {frame_max}"
        )
    encode = publish_parts if len(body) > WHOLE_BODY_MAX else publish_frames
    data = encode(
        number,
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        content_header=content_header,
        frame_max=frame_max,
    )
    matched = (
        None
        if match_header is None or not headers or isinstance(headers, UndecodableTable)
        else headers.get(match_header)
    )
    return content_header, data, matched
