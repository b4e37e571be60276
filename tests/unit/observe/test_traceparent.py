"""The ``traceparent`` header read as W3C trace context says, whatever a producer wrote.

Trace id 32, parent id 16 and flags 2 lower-case hex digits, never all zeros, version
``ff`` refused: anything else is no context, and no text makes the reading raise.
"""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.observe.tracing.sampling import SampledTracer, Sampling, traceparent
from sidecar.wire import Delivery

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
VALID = f"00-{TRACE_ID}-{SPAN_ID}-01"
HEX = "0123456789abcdef"

# Each of the right length, a dash inside one of its fields.
DASHED = [
    f"00-{TRACE_ID[:16]}-{TRACE_ID[17:]}-{SPAN_ID}-01",
    f"00-{TRACE_ID[:22]}-{TRACE_ID[23:]}-{SPAN_ID}-01",
    f"00-{TRACE_ID}-{SPAN_ID[:8]}-{SPAN_ID[9:]}-01",
    f"00-{TRACE_ID}-{SPAN_ID}--1",
    f"-0-{TRACE_ID}-{SPAN_ID}-01",
    f"01-{TRACE_ID[:-1]}--{SPAN_ID}-01-more",
]


@pytest.mark.parametrize("value", DASHED)
def test_a_dash_inside_an_id_is_no_trace_context(value: str) -> None:
    assert len(value.removesuffix("-more")) == len(VALID)
    assert traceparent(value) is None
    assert traceparent(value.encode()) is None


@pytest.mark.parametrize("value", DASHED)
def test_a_delivery_with_a_dashed_id_starts_a_trace_of_its_own_and_is_counted(value: str) -> None:
    invalid: list[str] = []
    begun: list[object] = []
    tracer = SampledTracer(
        "orders",
        sampling=Sampling(parent_based=False, ratio=0.5, draw=lambda: 0.0),
        follows=True,
        invalid=invalid.append,
        begin=lambda _delivery, parent: begun.append(parent),
    )
    tracer.start(_delivery(value))
    assert invalid == ["orders"]
    assert begun == [None]


def test_a_valid_traceparent_gives_its_flag_and_its_trace_ids_low_bits() -> None:
    assert traceparent(VALID) == (True, TRACE_ID[16:])
    assert traceparent(f" {VALID[:-2]}00\t") == (False, TRACE_ID[16:])


def _fields(draw: st.DrawFn, alphabet: str) -> str:
    sizes = (2, 32, 16, 2)
    parts = [draw(st.text(alphabet, min_size=size, max_size=size)) for size in sizes]
    return "-".join(parts) + draw(st.sampled_from(["", "-", "-x", " ", "\t"]))


@st.composite
def _near_traceparents(draw: st.DrawFn) -> str:
    """Text shaped like a traceparent, each field from hex, dashes, capitals and blanks."""
    return _fields(draw, draw(st.sampled_from([HEX, HEX + "-", HEX + "-AF ", "0-"])))


@given(st.one_of(st.text(), st.binary(), _near_traceparents()))
def test_no_text_makes_the_reading_raise_and_what_it_takes_is_trace_context(
    value: str | bytes,
) -> None:
    parent = traceparent(value)
    if parent is None:
        return
    text = (value.decode() if isinstance(value, bytes) else value).strip(" \t")
    version, trace_id, span_id, flags = text.split("-")[:4]
    assert all(set(field) <= set(HEX) for field in (version, trace_id, span_id, flags))
    assert (len(version), len(trace_id), len(span_id), len(flags)) == (2, 32, 16, 2)
    assert version != "ff"
    assert set(trace_id) != {"0"}
    assert set(span_id) != {"0"}
    assert parent == (int(flags, 16) & 1 == 1, trace_id[16:])
    Sampling(parent_based=False, ratio=0.5).sampled(parent, follows=False)  # never raises


def _delivery(value: str) -> Delivery:
    return Delivery(
        delivery_tag=1,
        exchange="",
        routing_key="q",
        redelivered=False,
        properties=MappingProxyType({}),
        headers=MappingProxyType({"traceparent": value}),
        body=b"",
    )
