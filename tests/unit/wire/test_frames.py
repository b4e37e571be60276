"""The hot-path frame codec, checked against pamqp (an independent AMQP codec) and itself."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from sidecar.amqp import install_codec
from sidecar.errors import WireError
from sidecar.wire import (
    HEADER,
    FieldValue,
    Int8,
    Int32,
    UndecodableTable,
    ack_frame,
    content_header,
    encode_table,
    parse_confirm,
    parse_content_header,
    parse_deliver,
    parse_return,
    publish_frames,
)
from tests.unit.strategies import field_table_bytes, field_tables, same_typed

install_codec()

# pamqp attribute name -> ours, for the properties both know.
PAMQP_NAMES = {"message_type": "type"}
EVERY_PROPERTY: dict[str, Any] = {
    "content_type": "application/json",
    "content_encoding": "gzip",
    "delivery_mode": 2,
    "priority": 9,
    "correlation_id": "corr-1",
    "reply_to": "amq.rabbitmq.reply-to",
    "expiration": "60000",
    "message_id": "m-1",
    "timestamp": 1_764_400_000,
    "type": "order.placed",
    "user_id": "guest",
    "app_id": "checkout",
    "cluster_id": "legacy",
}


def publish(channel: int, *, properties: Any, headers: Any, body: bytes, **kw: Any) -> bytes:
    """A publish's frames with the content header encoded from properties and headers."""
    header = content_header(properties, headers, body_size=len(body), frame_max=kw["frame_max"])
    return publish_frames(channel, body=body, content_header=header, **kw)


def frames_of(data: bytes) -> list[tuple[int, int, bytes]]:
    """Split bytes into (type, channel, payload), checking every frame-end octet."""
    out, at = [], 0
    while at < len(data):
        kind, channel, size = HEADER.unpack_from(data, at)
        assert data[at + 7 + size] == 0xCE
        out.append((kind, channel, data[at + 7 : at + 7 + size]))
        at += 8 + size
    return out


def pamqp_frames(data: bytes) -> list[Any]:
    """Decode bytes frame by frame with pamqp."""
    out, at = [], 0
    while at < len(data):
        used, _, value = pamqp_frame.unmarshal(data[at:])
        out.append(value)
        at += used
    return out


def test_publish_frames_are_what_pamqp_reads() -> None:
    headers = {"x-acemq-id": "m-1", "x-small": Int8(-3), "nested": {"a": [1, "b"]}}
    body = bytes(range(256)) * 40  # 10 KiB: three body frames at a 4 KiB frame size
    data = publish(
        7,
        exchange="orders",
        routing_key="order.placed",
        body=body,
        properties=EVERY_PROPERTY,
        headers=headers,
        frame_max=4096,
    )
    assert {channel for _, channel, _ in frames_of(data)} == {7}
    method, content, *bodies = pamqp_frames(data)
    assert isinstance(method, spec.Basic.Publish)
    assert (method.exchange, method.routing_key, method.mandatory) == (
        "orders",
        "order.placed",
        True,
    )
    assert isinstance(content, pamqp_header.ContentHeader)
    assert content.body_size == len(body)
    for attribute, value in vars(content.properties).items():
        name = PAMQP_NAMES.get(attribute, attribute)
        if name == "headers":
            assert same_typed(value, headers)
        else:
            assert value == EVERY_PROPERTY.get(name), name
    assert [len(b.value) for b in bodies] == [4088, 4088, 2064]
    assert b"".join(b.value for b in bodies) == body


def test_an_empty_body_has_no_body_frame_and_no_headers_no_table() -> None:
    data = publish(
        1, exchange="", routing_key="q", body=b"", properties={}, headers={}, frame_max=4096
    )
    kinds = [kind for kind, _, _ in frames_of(data)]
    assert kinds == [1, 2]
    header = parse_content_header(frames_of(data)[1][2])
    assert (header.body_size, header.properties, header.headers) == (0, {}, None)


def test_content_header_from_pamqp_reads_back_every_property() -> None:
    properties = spec.Basic.Properties(
        **{k: v for k, v in EVERY_PROPERTY.items() if k not in {"type", "cluster_id"}},
        message_type="order.placed",
        headers={"x-acemq-attempt": 2},
    )
    properties.cluster_id = "legacy"  # pamqp's constructor refuses it; the wire has it
    raw = pamqp_frame.marshal(pamqp_header.ContentHeader(0, 123, properties), 3)
    header = parse_content_header(frames_of(raw)[0][2])
    assert header.body_size == 123
    assert header.properties == EVERY_PROPERTY
    assert same_typed(header.headers, {"x-acemq-attempt": Int32(2)})


@settings(max_examples=200)
@given(
    headers=field_tables(),
    properties=st.fixed_dictionaries(
        {},
        optional={
            "content_type": st.text(max_size=40),
            "delivery_mode": st.integers(0, 255),
            "priority": st.integers(0, 255),
            "message_id": st.text(max_size=80),
            "timestamp": st.integers(0, 2**64 - 1),
            "user_id": st.text(max_size=20),
            "cluster_id": st.text(max_size=20),
        },
    ),
    body=st.binary(max_size=3000),
)
def test_publish_then_read_gives_back_properties_headers_and_body(
    headers: dict[str, Any], properties: dict[str, Any], body: bytes
) -> None:
    try:
        data = publish(
            2,
            exchange="x",
            routing_key="k",
            body=body,
            properties=properties,
            headers=headers,
            frame_max=1024,
        )
    except WireError:
        return  # a text over 255 bytes once encoded: refused before anything is written
    _, (_, _, content), *bodies = frames_of(data)
    header = parse_content_header(content)
    assert header.properties == properties
    assert same_typed(header.headers, headers or None)
    assert b"".join(payload for _, _, payload in bodies) == body


@given(raw=field_table_bytes())
def test_any_well_formed_table_survives_read_and_write_byte_for_byte(raw: bytes) -> None:
    payload = struct.pack(">HHQH", 60, 0, 0, 1 << 13) + raw
    header = parse_content_header(payload)
    assert not isinstance(header.headers, UndecodableTable)
    data = publish(
        1,
        exchange="",
        routing_key="q",
        body=b"",
        properties={},
        headers=header.headers,
        frame_max=131072,
    )
    assert frames_of(data)[1][2][14:] == (raw if header.headers else b"")


def test_an_undecodable_table_is_kept_raw_and_written_back_unchanged() -> None:
    bad = b"\x00\x00\x00\x05\x01aZ\x00\x00"  # field "a" with the unknown tag Z
    payload = struct.pack(">HHQH", 60, 0, 4, (1 << 13) | (1 << 7)) + bad + b"\x02id"
    header = parse_content_header(payload)
    assert isinstance(header.headers, UndecodableTable)
    assert header.headers.raw == bad
    assert header.properties == {"message_id": "id"}  # what follows the table still reads
    data = publish(
        1,
        exchange="",
        routing_key="q",
        body=b"abcd",
        properties=header.properties,
        headers=header.headers,
        frame_max=131072,
    )
    assert frames_of(data)[1][2] == payload


def test_text_that_is_not_utf8_survives_as_the_same_bytes() -> None:
    payload = struct.pack(">HHQH", 60, 0, 0, 1 << 7) + b"\x03\xff\xfe!"
    header = parse_content_header(payload)
    data = publish(
        1,
        exchange="",
        routing_key="q",
        body=b"",
        properties=header.properties,
        headers=None,
        frame_max=4096,
    )
    assert frames_of(data)[1][2] == payload


@pytest.mark.parametrize(
    ("properties", "problem"),
    [
        ({"message_id": "m" * 256}, "property message_id is 256 bytes"),
        ({"priority": 256}, "not an octet"),
        ({"timestamp": -1}, "not an unsigned 64-bit time"),
    ],
)
def test_what_the_wire_cannot_carry_is_refused_by_name(
    properties: dict[str, Any], problem: str
) -> None:
    with pytest.raises(WireError, match=problem):
        publish(
            1,
            exchange="",
            routing_key="q",
            body=b"",
            properties=properties,
            headers=None,
            frame_max=4096,
        )


def test_headers_larger_than_a_frame_are_refused_not_split() -> None:
    with pytest.raises(WireError, match="over the broker's frame size"):
        publish(
            1,
            exchange="",
            routing_key="q",
            body=b"",
            properties={},
            headers={"big": "x" * 5000},
            frame_max=4096,
        )


def method_payload(method: Any) -> bytes:
    return frames_of(pamqp_frame.marshal(method, 1))[0][2]


def test_deliver_return_and_confirms_read_as_pamqp_writes_them() -> None:
    deliver = spec.Basic.Deliver(
        consumer_tag="ctag",
        delivery_tag=2**40,
        redelivered=True,
        exchange="ex",
        routing_key="rk",
    )
    got = parse_deliver(method_payload(deliver))
    assert (got.consumer_tag, got.delivery_tag, got.redelivered, got.exchange, got.routing_key) == (
        "ctag",
        2**40,
        True,
        "ex",
        "rk",
    )
    returned = parse_return(
        method_payload(spec.Basic.Return(312, "NO_ROUTE", exchange="ex", routing_key="rk"))
    )
    assert (returned.reply_code, returned.reply_text, returned.exchange, returned.routing_key) == (
        312,
        "NO_ROUTE",
        "ex",
        "rk",
    )
    assert parse_confirm(method_payload(spec.Basic.Ack(delivery_tag=9, multiple=True))) == (9, True)
    assert parse_confirm(method_payload(spec.Basic.Nack(delivery_tag=4, multiple=False))) == (
        4,
        False,
    )


def test_ack_frame_is_what_pamqp_reads() -> None:
    (ack,) = pamqp_frames(ack_frame(5, 77, multiple=True))
    assert isinstance(ack, spec.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (77, True)


def test_a_truncated_method_is_a_wire_error() -> None:
    payload = method_payload(
        spec.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    )
    with pytest.raises(WireError, match="truncated"):
        parse_deliver(payload[:-3])


def test_table_encoding_matches_the_wire_module() -> None:
    headers: dict[str, FieldValue] = {"a": 1, "b": "two"}
    data = publish(
        1,
        exchange="",
        routing_key="q",
        body=b"",
        properties={},
        headers=headers,
        frame_max=4096,
    )
    assert frames_of(data)[1][2][14:] == encode_table(headers)
