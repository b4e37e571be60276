"""Cross-client interop: what the sidecar relays, every consumer in every language decodes.

One run (tests/interop/conftest.py) relays the message set of tests/interop/messages.py
through ``acemq-sidecar run`` and the real broker, and the consumers of
tests/interop/clients read every copy: the RabbitMQ Java client, amqp091-go, Bunny on
amq-protocol, pamqp through aiormq, and pika. The tests then hold each client's lines
against three things: the sender's values (what was meant), the sidecar's output as the
project's codec reads it (what was relayed), and tests/interop/canonical.py's model of the
client's decoder, whose deviation table lists, with evidence, every value a client decodes
wrongly whatever the relay does. The raw copies (no sidecar) show what the relay adds.

A missing toolchain skips its client on a developer's machine and fails under CI=true.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.wire import tag_of
from tests.conftest import REPO
from tests.interop.canonical import (
    CLIENTS,
    DEVIATION_KEYS,
    DEVIATIONS,
    UNDECODABLE,
    WIDENED,
    Deviation,
    Model,
    UndecodableError,
    meaning,
    sent_meaning,
    strict,
    typed,
    walk,
    widen,
)
from tests.interop.conftest import Run
from tests.interop.messages import MESSAGES, RAW, is_application_header

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

BY_NAME = {message.name: message for message in MESSAGES}

RAW_ERROR: dict[str, str] = {
    "java": r"MalformedFrameException: Unrecognised type in table",
    "go": r"Exception \(502\) Reason: .*invalid field or value inside of a frame",
    "ruby": r'ArgumentError: (Not a valid type|unsupported type in a table value): "[Bui]"',
}
"""What each client says when it meets a tag it cannot decode (a pattern, for the raw copies).

Go's 502 is the SYNTAX_ERROR it closes the connection with; Ruby's two messages are from
amq-protocol's table and array decoders.
"""


def _expected(model: Model, copy_headers: dict[str, Any], properties: dict[str, Any]) -> Any:
    return {
        "headers": {k: strict(v) for k, v in model.headers(copy_headers).items()},
        "properties": model.properties(properties),
    }


def _actual(line: dict[str, Any]) -> Any:
    return {
        "headers": {k: strict(v) for k, v in line["headers"].items()},
        "properties": line["properties"],
    }


def _differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = []
    for part in ("headers", "properties"):
        for name in sorted(set(want[part]) | set(got[part])):
            w, g = want[part].get(name, "<absent>"), got[part].get(name, "<absent>")
            if w != g:
                out.append(f"{part}[{name!r}]: expected {w!r}, got {g!r}")
    return out


def test_every_message_is_relayed_not_quarantined(interop: Run) -> None:
    assert interop.quarantined == {}, f"quarantined by the sidecar: {interop.quarantined}"
    missing = sorted(m.name for m in MESSAGES if m.name not in interop.reference)
    assert missing == [], f"no relayed copy of {missing}"


def test_sidecar_relays_application_headers_with_their_types_unsigned_widened(
    interop: Run,
) -> None:
    """The relayed copy holds every application header, same value and tag (B/u/i widened)."""
    wrong: list[str] = []
    for name, copy in interop.reference.items():
        sent = BY_NAME[name].application_headers()
        want = {k: typed(widen(v)) for k, v in sent.items()}
        got = {k: typed(v) for k, v in copy.headers.items() if is_application_header(k)}
        if got != want:
            wrong.extend(
                f"{name}: {k}: sent {want.get(k, '<absent>')}, relayed {got.get(k, '<absent>')}"
                for k in sorted(set(want) | set(got))
                if want.get(k) != got.get(k)
            )
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("client", CLIENTS)
def test_client_decodes_every_relayed_message(interop: Run, client: str) -> None:
    interop.require(client)
    failed = {
        name: line["error"]
        for name in interop.reference
        if not (line := interop.line(client, name))["ok"]
    }
    assert failed == {}, f"{client} could not decode relayed messages: {failed}"
    bodies = {name: interop.line(client, name)["body"] for name in interop.reference}
    assert bodies == {name: name for name in interop.reference}, "a queue held another message"


def _unsigned_leaves(value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[Any, ...]]:
    """(path, value) of every B, u, i in a sent value, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _unsigned_leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unsigned_leaves(item, (*path, index))
    elif tag_of(value) in WIDENED:
        yield path, int(value)


def _pair_at(headers: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    """The PAIR a client printed at a path of header names, table keys and array indexes."""
    pair: Any = ["table", headers]
    for step in path:
        kind, value = pair
        found = value.get(step) if kind == "table" else None
        if kind == "array" and isinstance(step, int) and step < len(value):
            found = value[step]
        if found is None:
            return None
        pair = found
    return pair


def test_ruby_reads_every_element_the_sidecar_widened(interop: Run) -> None:
    """A widened B, u or i is read by Ruby wherever it stands, last in an array included."""
    interop.require("ruby")
    lost: list[str] = []
    for name in interop.reference:
        line = interop.line("ruby", name)
        assert line["ok"], f"{name}: not decoded: {line['error']}"
        for header, value in BY_NAME[name].application_headers().items():
            for path, number in _unsigned_leaves(value, (header,)):
                pair = _pair_at(line["headers"], path)
                if pair is None or meaning(pair) != ("int", number):
                    lost.append(f"{name}: {path}: sent {number}, Ruby read {pair}")
    assert lost == [], "\n".join(lost)


@pytest.mark.parametrize("client", CLIENTS)
def test_client_prints_what_the_model_of_its_decoder_predicts(interop: Run, client: str) -> None:
    """Each relayed copy, kinds included, is what canonical.py's model of the client says."""
    interop.require(client)
    model = Model(client)
    wrong = []
    for name, copy in interop.reference.items():
        line = interop.line(client, name)
        if not line["ok"]:
            wrong.append(f"{name}: not decoded: {line['error']}")
            continue
        wrong.extend(
            f"{name}: {difference}"
            for difference in _differences(
                _expected(model, copy.headers, copy.properties), _actual(line)
            )
        )
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("client", CLIENTS)
def test_application_headers_decode_to_what_the_sender_meant(interop: Run, client: str) -> None:
    """Every application header reads back as sent, but where DEVIATIONS says it cannot."""
    interop.require(client)
    model = Model(client)
    wrong: list[str] = []
    deviating: list[str] = []
    for name in interop.reference:
        line = interop.line(client, name)
        if not line["ok"]:
            wrong.append(f"{name}: not decoded: {line['error']}")
            continue
        for header, value in BY_NAME[name].application_headers().items():
            got = meaning(line["headers"][header]) if header in line["headers"] else "<absent>"
            meant = sent_meaning(value)
            if got == meant:
                continue
            predicted = meaning(model.value(widen(value)))
            if got == predicted:
                deviating.append(f"{name}: {header}")
            else:
                wrong.append(f"{name}: {header}: sent {meant!r}, decoded {got!r}")
    assert wrong == [], "\n".join(wrong)
    print(f"{client}: values the client itself decodes otherwise (DEVIATIONS): {deviating}")  # noqa: T201


def test_contract_headers_decode_to_the_same_values_in_every_client(interop: Run) -> None:
    available = [client for client in CLIENTS if client in interop.outputs]
    for client in available:
        interop.require(client)
    assert available, "no interop client could run"
    wrong = []
    for name, copy in interop.reference.items():
        for header, value in copy.headers.items():
            if is_application_header(header):
                continue
            relayed = sent_meaning(value)
            for client in available:
                line = interop.line(client, name)
                pair = line["headers"].get(header) if line["ok"] else None
                got = "<not decoded>" if pair is None else meaning(pair)
                if got != relayed:
                    wrong.append(f"{name}: {header}: relayed {relayed!r}, {client} read {got!r}")
        for prop in ("message_id", "reply_to"):
            values = {c: interop.line(c, name).get("properties", {}).get(prop) for c in available}
            if len(set(values.values())) != 1:
                wrong.append(f"{name}: property {prop} differs: {values}")
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("client", CLIENTS)
def test_raw_message_fails_only_where_the_client_lacks_a_tag(interop: Run, client: str) -> None:
    """Unrelayed, a message fails exactly in the clients without one of its tags; relayed, not."""
    interop.require(client)
    model = Model(client)
    wrong = []
    for message in RAW:
        raw = interop.line(client, message.name, raw=True)
        lacking = sorted(set(walk(message.headers)) & UNDECODABLE[client])
        if lacking:
            if raw["ok"]:
                wrong.append(f"{message.name}: decoded although it holds {lacking}")
            elif not re.search(RAW_ERROR[client], raw["error"]):
                wrong.append(f"{message.name}: error {raw['error']!r} lacks {RAW_ERROR[client]!r}")
            relayed = interop.line(client, message.name)
            if not relayed["ok"]:
                wrong.append(f"{message.name}: the relayed copy failed too: {relayed['error']}")
            continue
        if not raw["ok"]:
            wrong.append(f"{message.name}: failed without an undecodable tag: {raw['error']}")
            continue
        want = {k: strict(v) for k, v in model.headers(message.headers).items()}
        got = {k: strict(v) for k, v in raw["headers"].items()}
        if want != got:
            wrong.append(f"{message.name}: raw copy decoded as {got}, model says {want}")
    assert wrong == [], "\n".join(wrong)


def test_each_client_lacks_the_tags_the_contract_says() -> None:
    """UNDECODABLE agrees with docs/contract.md section 7, save the installed Java client's `u`."""
    contract = {"java": set("Bi"), "go": set("ui"), "ruby": set("Bui")}
    installed_java_extra = {"java": {"u"}}  # 5.0.0 has no 'u' either (its ValueReader)
    for client, tags in contract.items():
        assert UNDECODABLE[client] == tags | installed_java_extra.get(client, set())


@pytest.mark.parametrize("deviation", DEVIATIONS, ids=lambda d: d.key)
def test_each_deviation_shows_in_the_clients_real_output(
    interop: Run, deviation: Deviation
) -> None:
    """Without the row, the model disagrees with the client on some message: the row is real."""
    interop.require(deviation.client)
    model = Model(deviation.client, without=frozenset({deviation.key}))
    for name, copy in interop.reference.items():
        line = interop.line(deviation.client, name)
        try:
            want = _expected(model, copy.headers, copy.properties)
        except UndecodableError:
            continue
        if line["ok"] and _differences(want, _actual(line)):
            return
    pytest.fail(f"{deviation.key}: no message shows it; drop the row or add a message that does")


def test_docs_list_every_deviation() -> None:
    text = (REPO / "docs" / "interop.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z0-9]+-[a-z0-9-]+)` \|", text, flags=re.MULTILINE))
    assert listed == DEVIATION_KEYS, (
        f"docs/interop.md lacks {sorted(DEVIATION_KEYS - listed)}, "
        f"names unknown {sorted(listed - DEVIATION_KEYS)}"
    )
