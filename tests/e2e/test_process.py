"""The sidecar as a process: signals, kill -9, reloads, bad config, connection loss, pauses.

Each test publishes messages with distinct ``x-acemq-id`` and ``message_id`` values and
accounts for every one by id: relayed to the target queue or still in staging, never
lost. Where the invariants allow duplicates (at-least-once after a crash or a connection
loss) their number is printed; after a clean drain it must be zero.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
import yaml

from sidecar.service import CONFIG_POLL_S
from tests.e2e.conftest import (
    Flow,
    Sidecar,
    declare_flow,
    declare_quarantine,
    declare_target,
    duplicates,
    eventually,
    make_ids,
    publish_ids,
    take_ids,
    take_until,
)
from tests.faults.conftest import RabbitCtl
from tests.support import Broker

pytestmark = pytest.mark.timeout(60)

FLOW_SIZE = 3000  # a few seconds of relaying on a local broker: room to interrupt it
PREFETCH = 200
GRACE_S = 10.0
EXIT_MARGIN_S = 5.0
DELIVERY_TIMEOUT_S = 30.0
REFUSED_LINE = 'acemq_sidecar_config_reloads_total{result="refused"} 1.0'


async def stop_cleanly(sidecar: Sidecar) -> None:
    """SIGTERM the sidecar and assert it exits 0 within the grace period and a margin."""
    sidecar.send(signal.SIGTERM)
    status = await sidecar.wait_exit(timeout_s=GRACE_S + EXIT_MARGIN_S)
    assert status == 0, f"exit status {status} after SIGTERM\n{sidecar.output()}"


async def account_after_fault(
    broker: Broker,
    sidecar: Sidecar,
    flow: Flow,
    ids: list[str],
    relayed: list[str],
    *,
    quarantined: str,
    fault: str,
) -> None:
    """Stop cleanly, then assert every id was relayed (duplicates allowed and reported)."""
    await stop_cleanly(sidecar)
    relayed += await take_ids(broker, flow.target)
    left = await take_ids(broker, flow.staging)
    print(  # noqa: T201 - the measurement the fault tests report
        f"{fault}: {len(ids)} messages, {len(relayed)} relayed, {duplicates(relayed)} duplicates"
    )
    assert set(relayed) == set(ids)
    assert left == [], f"{len(left)} still in staging after a clean stop\n{sidecar.output()}"
    assert await take_ids(broker, quarantined) == []


async def wait_partial(broker: Broker, sidecar: Sidecar, queue: str, *, at_least: int) -> None:
    """Wait until a target queue holds ``at_least`` messages: the flow is under way."""

    async def started() -> bool:
        return await broker.depth(queue) >= at_least

    await eventually(
        started, timeout_s=DELIVERY_TIMEOUT_S, what=f"{at_least} on {queue}", context=sidecar.output
    )


@pytest.mark.e2e
async def test_sigterm_mid_flow_settles_in_flight_loses_nothing_and_exits_0(
    broker: Broker, sidecar: Sidecar
) -> None:
    """SIGTERM drains in-flight work (confirm, then ack) and exits 0: no loss, no duplicate."""
    quarantine, quarantined = await declare_quarantine(broker)
    flow = await declare_flow(broker, "term")
    ids = make_ids("term", FLOW_SIZE)
    await publish_ids(broker, flow.staging, ids)
    sidecar.write(
        sidecar.route_map(
            quarantine=quarantine, flows=[flow], prefetch=PREFETCH, shutdown_grace_s=GRACE_S
        )
    )
    await sidecar.start()
    await wait_partial(broker, sidecar, flow.target, at_least=PREFETCH)

    await stop_cleanly(sidecar)

    relayed = await take_ids(broker, flow.target)
    left = await take_ids(broker, flow.staging)
    lost = set(ids) - set(relayed) - set(left)
    both = set(relayed) & set(left)  # relayed but not acked: a duplicate in waiting
    print(  # noqa: T201 - the measurement the fault tests report
        f"SIGTERM: {len(set(relayed))} relayed, {len(left)} left in staging,"
        f" {duplicates(relayed)} duplicates, {len(both)} relayed but unacked"
    )
    assert not lost, f"{len(lost)} lost, e.g. {sorted(lost)[:5]}\n{sidecar.output()}"
    assert 0 < len(set(relayed)) < len(ids), "SIGTERM did not arrive mid-flow; nothing proven"
    assert duplicates(relayed) == 0, f"duplicates after a clean drain\n{sidecar.output()}"
    assert not both, (
        f"{len(both)} relayed yet left unacked in staging (in-flight work not settled),"
        f" e.g. {sorted(both)[:5]}\n{sidecar.output()}"
    )
    assert await take_ids(broker, quarantined) == []
    assert "draining" in sidecar.stderr(), sidecar.output()


@pytest.mark.version_changed
@pytest.mark.e2e
async def test_kill_9_mid_flow_then_restart_loses_nothing(broker: Broker, sidecar: Sidecar) -> None:
    """kill -9 mid-flow loses nothing: the restarted sidecar relays every unacked message."""
    quarantine, quarantined = await declare_quarantine(broker)
    flow = await declare_flow(broker, "kill")
    ids = make_ids("kill", FLOW_SIZE)
    await publish_ids(broker, flow.staging, ids)
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=PREFETCH))
    await sidecar.start()
    await wait_partial(broker, sidecar, flow.target, at_least=PREFETCH)

    sidecar.send(signal.SIGKILL)
    status = await sidecar.wait_exit(timeout_s=EXIT_MARGIN_S)
    assert status == -signal.SIGKILL, sidecar.output()
    # The broker requeues the dead consumer's unacked deliveries; some must be left to relay.
    assert await broker.depth(flow.staging) > 0, "kill -9 did not arrive mid-flow"

    await sidecar.start()
    relayed = await take_until(
        broker, flow.target, ids, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
    )
    await account_after_fault(
        broker, sidecar, flow, ids, relayed, quarantined=quarantined, fault="kill -9"
    )


@pytest.mark.e2e
async def test_sighup_adds_a_route_and_refuses_an_invalid_map(
    broker: Broker, sidecar: Sidecar
) -> None:
    """SIGHUP applies a valid new route map live, and refuses an invalid one, keeping the old."""
    quarantine, _ = await declare_quarantine(broker)
    first = await declare_flow(broker, "first")
    second = await declare_flow(broker, "second")
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[first]))
    sidecar.pad()  # room to rewrite it at the same size: only SIGHUP may trigger the reloads
    await sidecar.start()

    async def relays(flow_ids: list[str], flow: Flow) -> None:
        await publish_ids(broker, flow.staging, flow_ids)
        await take_until(
            broker, flow.target, flow_ids, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
        )

    await relays(make_ids("first-a", 10), first)
    waiting = make_ids("second-a", 10)
    await publish_ids(broker, second.staging, waiting)

    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[first, second]), keep_stamp=True)
    sidecar.send(signal.SIGHUP)
    await take_until(
        broker, second.target, waiting, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
    )
    await relays(make_ids("first-b", 10), first)
    await sidecar.wait_ready()

    invalid = sidecar.route_map(quarantine=quarantine, flows=[first, second])
    invalid["retries"] = 3  # unknown keys are errors
    sidecar.write(invalid, keep_stamp=True)
    sidecar.send(signal.SIGHUP)

    async def refused() -> bool:
        return await sidecar.metric("acemq_sidecar_config_reloads_total", result="refused") >= 1

    await eventually(refused, timeout_s=10, what="the reload refused", context=sidecar.output)
    assert sidecar.is_running(), sidecar.output()
    await relays(make_ids("first-c", 10), first)
    await relays(make_ids("second-b", 10), second)
    await sidecar.wait_ready()
    text = await sidecar.metrics_text()
    assert REFUSED_LINE in text, text
    assert 'acemq_sidecar_config_reloads_total{result="applied"} 1.0' in text, text
    line = yaml.safe_dump(invalid).splitlines().index("retries: 3") + 1
    assert f"{sidecar.config}:{line}: retries: unknown key" in sidecar.stderr(), sidecar.output()


@pytest.mark.e2e
@pytest.mark.parametrize("valid", [True, False], ids=["valid", "invalid"])
async def test_an_edit_followed_by_sighup_is_one_reload(
    broker: Broker, sidecar: Sidecar, *, valid: bool
) -> None:
    """Editing the file then sending SIGHUP (the documented way) reloads it once, not twice."""
    quarantine, _ = await declare_quarantine(broker)
    first = await declare_flow(broker, "first")
    second = await declare_flow(broker, "second")
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[first]))
    await sidecar.start()

    edited = sidecar.route_map(quarantine=quarantine, flows=[first, second])
    if not valid:
        edited["retries"] = 3
    sidecar.write(edited)
    sidecar.send(signal.SIGHUP)
    result = "applied" if valid else "refused"

    async def reloaded() -> bool:
        return await sidecar.metric("acemq_sidecar_config_reloads_total", result=result) >= 1

    await eventually(reloaded, timeout_s=10, what=f"a reload {result}", context=sidecar.output)
    # The file watcher polls every CONFIG_POLL_S; give it two chances to reload again.
    await asyncio.sleep(2 * CONFIG_POLL_S + 1)
    text = await sidecar.metrics_text()
    assert f'acemq_sidecar_config_reloads_total{{result="{result}"}} 1.0' in text, (
        f"one edit and one SIGHUP should be one reload {result}:\n"
        + "\n".join(line for line in text.splitlines() if "config_reloads_total{" in line)
        + f"\n{sidecar.output()}"
    )


BAD_MAPS = {
    "unknown key": ("    retries: 3\n", "unknown key"),
    "bad enum": ("    publishers: app\n", 'expected "acemq" or "apps", got "app"'),
    "out of range": ("    prefetch: 0\n", "expected an integer from 1 to 65535"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("case", sorted(BAD_MAPS))
async def test_bad_config_exits_2_naming_file_and_line(
    broker: Broker, sidecar: Sidecar, case: str
) -> None:
    """A bad route map exits 2 before touching a message; stderr says FILE:LINE: and what."""
    bad_line, expected = BAD_MAPS[case]
    quarantine, _ = await declare_quarantine(broker)
    flow = await declare_flow(broker, "bad")
    await publish_ids(broker, flow.staging, ["bad-00000"])
    text = (
        f"broker:\n  url: {broker.url}\n"
        f"http:\n  listen: 127.0.0.1:{sidecar.port}\n"
        f"quarantine:\n  exchange: {quarantine}\n"
        "routes:\n"
        f"  - name: bad\n    from: {flow.staging}\n"
        f"    to: {{exchange: {flow.exchange}}}\n"
        f"{bad_line}"
    )
    line = text.splitlines().index(bad_line.rstrip("\n")) + 1
    sidecar.write(text)

    await sidecar.start(wait_ready=False)
    status = await sidecar.wait_exit(timeout_s=20)

    assert status == 2, sidecar.output()
    stderr = sidecar.stderr()
    assert f"{sidecar.config}:{line}:" in stderr, stderr
    assert expected in stderr, stderr
    assert await broker.depth(flow.staging) == 1


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["close_all_connections", "broker restart"])
async def test_connection_loss_mid_flow_reconnects_and_loses_nothing(
    broker: Broker, sidecar: Sidecar, rabbitmqctl: RabbitCtl, fault: str
) -> None:
    """Connections closed or the broker restarted mid-flow: reconnect and relay every id."""
    quarantine, quarantined = await declare_quarantine(broker)
    flow = await declare_flow(broker, "loss")
    ids = make_ids("loss", FLOW_SIZE)
    await publish_ids(broker, flow.staging, ids)
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[flow], prefetch=PREFETCH))
    await sidecar.start()
    assert await sidecar.metric("acemq_sidecar_reconnects_total") == 0
    await wait_partial(broker, sidecar, flow.target, at_least=PREFETCH)

    if fault == "broker restart":
        for command in ("stop_app", "start_app", "await_startup"):
            await rabbitmqctl.run(command)
    else:
        await rabbitmqctl.close_all_connections()
    await broker.reconnect()  # our own connection went too

    async def reconnected() -> bool:
        return await sidecar.metric("acemq_sidecar_reconnects_total") >= 1

    await eventually(
        reconnected, timeout_s=DELIVERY_TIMEOUT_S, what="a reconnect", context=sidecar.output
    )
    await sidecar.wait_ready()
    relayed = await take_until(
        broker, flow.target, ids, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
    )
    await account_after_fault(
        broker, sidecar, flow, ids, relayed, quarantined=quarantined, fault=fault
    )


@pytest.mark.e2e
async def test_missing_target_exchange_pauses_only_its_route_until_it_exists(
    broker: Broker, sidecar: Sidecar
) -> None:
    """A missing target exchange pauses its route (503, messages stay) until it is declared."""
    quarantine, quarantined = await declare_quarantine(broker)
    flowing = await declare_flow(broker, "flowing")
    paused = await declare_flow(broker, "paused", with_exchange=False)
    flowing_ids, paused_ids = make_ids("flowing", 20), make_ids("paused", 20)
    await publish_ids(broker, flowing.staging, flowing_ids)
    await publish_ids(broker, paused.staging, paused_ids)
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[flowing, paused]))
    await sidecar.start(wait_ready=False)

    readyz: tuple[int, str] = (0, "")

    async def only_the_paused_route_not_ready() -> bool:
        nonlocal readyz
        readyz = await sidecar.get("/readyz")
        status, body = readyz
        if status != 503:
            return False
        routes = json.loads(body)["routes"]
        return paused.exchange in routes[paused.name] and routes[flowing.name] == "consuming"

    await eventually(
        only_the_paused_route_not_ready,
        timeout_s=30,
        what="/readyz 503 naming the missing exchange, and only that route",
        context=lambda: f"last /readyz: {readyz}\n{sidecar.output()}",
    )
    await take_until(
        broker, flowing.target, flowing_ids, timeout_s=DELIVERY_TIMEOUT_S, context=sidecar.output
    )
    assert await broker.depth(paused.staging) == len(paused_ids)
    assert await sidecar.metric("acemq_sidecar_route_up", route=paused.name) == 0
    assert await sidecar.metric("acemq_sidecar_route_up", route=flowing.name) == 1
    assert (await sidecar.get("/readyz"))[0] == 503

    await declare_target(broker, exchange=paused.exchange, target=paused.target)
    declared = time.monotonic()
    # The route retries with backoff capped at 30 s; it has been failing only seconds.
    resumed = await take_until(
        broker, paused.target, paused_ids, timeout_s=35, context=sidecar.output
    )
    print(f"paused route resumed {time.monotonic() - declared:.1f}s after the exchange appeared")  # noqa: T201
    assert sorted(resumed) == sorted(paused_ids)
    await sidecar.wait_ready(timeout_s=10)
    assert await take_ids(broker, quarantined) == []


@pytest.mark.e2e
async def test_copies_the_target_refuses_are_never_acked(broker: Broker, sidecar: Sidecar) -> None:
    """A nacked publish leaves its staging message unacked: what the target refuses stays."""
    quarantine, quarantined = await declare_quarantine(broker)
    staging = await broker.queue("full.staging")
    exchange = await broker.exchange("full.exchange")
    room = 5
    target = await broker.queue(
        "full.target", **{"x-max-length": room, "x-overflow": "reject-publish"}
    )
    await broker.bind(target, exchange)
    flow = Flow(name="full", staging=staging, exchange=exchange, target=target)
    ids = make_ids("full", 20)
    await publish_ids(broker, flow.staging, ids)
    sidecar.write(sidecar.route_map(quarantine=quarantine, flows=[flow]))
    await sidecar.start(wait_ready=False)

    async def refused() -> bool:
        return await broker.depth(target) == room and "nacked" in sidecar.stderr()

    await eventually(
        refused, timeout_s=DELIVERY_TIMEOUT_S, what="a full target refusing", context=sidecar.output
    )
    await stop_cleanly(sidecar)

    relayed = await take_ids(broker, flow.target)
    left = await take_ids(broker, flow.staging)
    lost = set(ids) - set(relayed) - set(left)
    assert not lost, (
        f"{len(lost)} acked although refused, e.g. {sorted(lost)[:5]}\n{sidecar.output()}"
    )
    assert len(relayed) == room
    assert await take_ids(broker, quarantined) == []
