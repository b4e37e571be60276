"""The ``acemq-sidecar`` command line: run, check, normalise, conform, quarantine.

The shell: parses arguments, reads files and stdin, configures logging, and hands off to
the modules that do the work. Exit codes: 0 success, 1 a conformance failure or a runtime
error, 2 bad input (usage, config, message).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sidecar import __version__, startup_signals
from sidecar.contract import (
    CONTRACT_VERSION,
    VectorError,
    message_from_json,
    normalise,
    run_vector,
    verdict_to_json,
)
from sidecar.errors import ConfigError, TlsFileError
from sidecar.observe import LEVELS, parse_level

if TYPE_CHECKING:
    from collections.abc import Coroutine, Sequence

    from sidecar.quarantine import BrokerTarget, QuarantinedMessage, Selection

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _log_level(text: str) -> str:
    """Read ``--log-level`` (or ``ACEMQ_LOG_LEVEL``) for argparse: any case, one of LEVELS."""
    try:
        return parse_level(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _new_id() -> str:
    return str(uuid.uuid4())


def _conform(files: Sequence[str]) -> int:
    passed = failed = 0
    for file in files:
        try:
            document = json.loads(Path(file).read_text(encoding="utf-8"))
            vectors = document["vectors"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{file}: cannot read vectors: {e}", file=sys.stderr)
            return EXIT_USAGE
        for index, vector in enumerate(vectors):
            name = vector.get("name", f"#{index}") if isinstance(vector, dict) else f"#{index}"
            try:
                difference = run_vector(vector, new_id=_new_id)
            except (VectorError, KeyError, TypeError, ValueError) as e:
                difference = f"malformed vector: {e!r}"
            if difference is None:
                passed += 1
            else:
                failed += 1
                print(f"FAIL {file}:{name}: {difference}")
    print(f"{passed} passed, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def _normalise_stdin() -> int:
    try:
        message: Any = json.load(sys.stdin)
        if not isinstance(message, dict):
            raise VectorError("expected a JSON object with routing_key, properties, headers")
        routing_key, properties, headers, policy, now_ms = message_from_json(
            message, now_ms=time.time_ns() // 1_000_000
        )
    except (ValueError, TypeError) as e:
        print(f"stdin: not a vector-format message: {e}", file=sys.stderr)
        return EXIT_USAGE
    verdict = normalise(
        routing_key, properties, headers, policy=policy, now_ms=now_ms, new_id=_new_id
    )
    json.dump(verdict_to_json(verdict), sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return EXIT_OK


def _check(file: str) -> int:
    from sidecar.route_files import load_config  # noqa: PLC0415 - pydantic is slow to import
    from sidecar.routemap import describe  # noqa: PLC0415

    try:
        route_map = load_config(file, env=os.environ)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    print(describe(route_map))
    return EXIT_OK


def _run(file: str, *, log_level: str | None) -> int:
    # Held already if the process came in by sidecar.console (the console script, -m sidecar);
    # again here for a caller of main(): a SIGTERM while the map loads is a clean stop.
    startup_signals.hold()
    # Imported here so that `conform` and `normalise` start without the I/O stack.
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from sidecar.clock import Clock  # noqa: PLC0415
    from sidecar.observe import TracingUnavailableError, configure  # noqa: PLC0415
    from sidecar.route_files import load_config  # noqa: PLC0415
    from sidecar.service import Service  # noqa: PLC0415

    try:
        route_map = load_config(file, env=os.environ)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    # The command line (or ACEMQ_LOG_LEVEL) wins over the file's log_level; INFO otherwise.
    configure(level=log_level or route_map.log_level or "INFO")
    try:
        service = Service(
            route_map,
            config_path=Path(file),
            env=os.environ,
            registry=CollectorRegistry(),
            clock=Clock.system(),
            new_id=_new_id,
            rng=random.Random(),  # noqa: S311 - backoff jitter, not security
        )
    except TracingUnavailableError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    tune_collector()
    try:
        return _run_loop(service.run())
    except OSError as e:  # the HTTP port is taken
        print(f"acemq-sidecar: {e}", file=sys.stderr)
        return EXIT_FAILED


# --- quarantine list / replay ---------------------------------------------------------------


def _nonempty(text: str) -> str:
    """Read a filter's text for argparse: an empty one would match nothing or everything."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _positive(text: str) -> int:
    """Read ``--limit`` for argparse: a whole number of messages, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of messages, 1 or more; got {text!r}"
        )
    return int(text)


def _quarantine_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("queue", metavar="QUEUE", help="the quarantine queue")
    command.add_argument("--route", type=_nonempty, help="only messages quarantined by this route")
    command.add_argument(
        "--reason", type=_nonempty, metavar="TEXT", help="only messages whose reason holds TEXT"
    )
    command.add_argument("--id", type=_nonempty, help="only the message with this x-acemq-id")
    command.add_argument("--limit", type=_positive, metavar="N", help="at most N selected messages")
    broker = command.add_mutually_exclusive_group()
    broker.add_argument(
        "--config", metavar="FILE", help="take the broker from this route map's broker section"
    )
    broker.add_argument("--url", metavar="URL", help="the broker URL (default: $AMQP_URL)")


def _quarantine(args: argparse.Namespace) -> int:
    from sidecar.quarantine import (  # noqa: PLC0415 - the I/O stack
        QuarantineInputError,
        Selection,
    )

    try:
        target = _broker_target(args.config, args.url)
    except (ConfigError, TlsFileError, ValueError) as e:  # BrokerAddressError: a ValueError
        print(f"acemq-sidecar quarantine: {e}", file=sys.stderr)
        return EXIT_USAGE
    selection = Selection(
        route=args.route, reason_contains=args.reason, message_id=args.id, limit=args.limit
    )
    try:
        return _run_loop(_quarantine_command(args, target, selection))
    except QuarantineInputError as e:
        print(f"acemq-sidecar quarantine: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectionError as e:  # the text never holds the password
        print(f"acemq-sidecar quarantine: broker {target.address.masked()}: {e}", file=sys.stderr)
        return EXIT_FAILED


def _broker_target(config: str | None, url: str | None) -> BrokerTarget:
    from sidecar.broker import BrokerAddress  # noqa: PLC0415
    from sidecar.quarantine import BrokerTarget  # noqa: PLC0415

    if config is not None:
        from sidecar.route_files import load_config  # noqa: PLC0415
        from sidecar.tls import client_context  # noqa: PLC0415

        broker = load_config(config, env=os.environ).broker
        address = broker.addresses[0]  # a cluster's first node: any node serves its queues
        return BrokerTarget(
            address=address,
            ssl_context=client_context(broker.tls) if address.tls else None,
            heartbeat_s=broker.heartbeat_s,
            connect_timeout_s=broker.connect_timeout_s,
        )
    url = url if url is not None else os.environ.get("AMQP_URL")
    if url is None:
        raise ValueError("no broker: give --config routes.yaml or --url URL, or set AMQP_URL")
    return BrokerTarget(address=BrokerAddress.parse(url))


async def _quarantine_command(
    args: argparse.Namespace, target: BrokerTarget, selection: Selection
) -> int:
    from sidecar.clock import Clock  # noqa: PLC0415
    from sidecar.quarantine import (  # noqa: PLC0415 - the I/O stack, only for this command
        format_rows,
        list_messages,
        open_connection,
        replay_messages,
    )

    connection = await open_connection(target)
    try:
        if args.quarantine == "list":
            rows: list[QuarantinedMessage] = []

            def on_row(row: QuarantinedMessage) -> None:
                if args.json:  # JSON lines leave as they come; a table needs every row
                    print(format_rows([row], as_json=True)[0], flush=True)
                else:
                    rows.append(row)

            report = await list_messages(
                connection, args.queue, selection, now_ms=Clock.system().now_ms(), on_row=on_row
            )
            if not args.json and report.selected:
                print("\n".join(format_rows(rows, as_json=False)))
            for note in report.notes():
                print(note, file=sys.stderr)
            return EXIT_FAILED if report.interrupted else EXIT_OK
        replay = await replay_messages(
            connection,
            args.queue,
            selection,
            to=args.to,
            dry_run=args.dry_run,
            clock=Clock.system(),
            progress=sys.stderr,
        )
        print("\n".join(replay.summary()))
        for note in replay.read.notes():
            print(note, file=sys.stderr)
        return EXIT_OK if replay.all_replayed and not replay.read.interrupted else EXIT_FAILED
    finally:
        await connection.close()


# Container objects allocated between two young collections (the interpreter's default is
# 700): the relay makes a few dozen per message and almost none outlive it, so a young
# collection every 700 finds little and costs 4.8 % of the instructions per message
# (docs/decisions/0064-collector.md); 50,000 of them are a few MB at most.
YOUNG_COLLECTION_EVERY: Final = 50_000


def tune_collector() -> None:
    """Set the cyclic garbage collector up for the relay, once start-up is done.

    What start-up built lives as long as the process: frozen, it stays out of the full
    passes, which otherwise pause the relay for milliseconds each. Young collections run
    every ``YOUNG_COLLECTION_EVERY`` allocations, older ones every 20 of those.
    """
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, 20, 20)


def _run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop where it is installed (measured faster, see bench/), else asyncio."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def version_line() -> str:
    """Return what ``--version`` prints: the release, the contract, and which build runs."""
    build = "compiled" if _compiled() else "plain"
    return f"acemq-sidecar {__version__} (contract {CONTRACT_VERSION}, {build} build)"


def _compiled() -> bool:
    """Whether the hot modules run compiled (mypyc): the contract's normaliser is one."""
    module = sys.modules[normalise.__module__]
    return not str(getattr(module, "__file__", "")).endswith(".py")


def build_parser() -> argparse.ArgumentParser:
    """Describe the command line."""
    parser = argparse.ArgumentParser(
        prog="acemq-sidecar",
        description="Relay RabbitMQ messages and enforce the AceMQ envelope contract.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="relay every route of a route map until SIGTERM")
    run.add_argument("--config", required=True, metavar="FILE", help="the YAML route map")
    # argparse passes a string default through the type too: a bad ACEMQ_LOG_LEVEL is a
    # usage error (exit 2) like a bad --log-level, not a traceback.
    run.add_argument(
        "--log-level",
        type=_log_level,
        default=os.environ.get("ACEMQ_LOG_LEVEL"),
        metavar="LEVEL",
        help=f"{', '.join(LEVELS)} (any case); default: $ACEMQ_LOG_LEVEL, else the route"
        " map's log_level, else INFO",
    )
    check = commands.add_parser("check", help="validate a route map and print its routes")
    check.add_argument("file", metavar="FILE")
    conform = commands.add_parser(
        "conform", help="run conformance vector files through the normaliser"
    )
    conform.add_argument("files", nargs="+", metavar="FILE")
    commands.add_parser(
        "normalise",
        help="normalise one vector-format message read as JSON on stdin; print the verdict",
    )
    quarantine = commands.add_parser(
        "quarantine", help="look into a quarantine queue, replay what was fixed"
    )
    actions = quarantine.add_subparsers(dest="quarantine", required=True)
    listing = actions.add_parser(
        "list", help="a row per message; changes nothing (every message goes back, in order)"
    )
    _quarantine_arguments(listing)
    listing.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    replay = actions.add_parser(
        "replay",
        help="send the selected originals back to their staging queue, stamped as replays",
    )
    _quarantine_arguments(replay)
    replay.add_argument(
        "--dry-run", action="store_true", help="say what would be replayed; change nothing"
    )
    replay.add_argument(
        "--to",
        metavar="QUEUE",
        type=_nonempty,
        help="replay to this queue instead of the one"
        " each message came from (acemq-quarantined-from)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = build_parser().parse_args(argv)
    match args.command:
        case "run":
            return _run(args.config, log_level=args.log_level)
        case "check":
            return _check(args.file)
        case "conform":
            return _conform(args.files)
        case "normalise":
            return _normalise_stdin()
        case "quarantine":
            return _quarantine(args)
    return EXIT_USAGE  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
