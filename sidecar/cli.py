"""The ``acemq-sidecar`` command line: run, check, normalise, conform.

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
from typing import TYPE_CHECKING, Any

from sidecar import startup_signals
from sidecar.contract import normalise
from sidecar.errors import ConfigError
from sidecar.logs import LEVELS, parse_level
from sidecar.vectors import VectorError, message_from_json, run_vector, verdict_to_json

if TYPE_CHECKING:
    from collections.abc import Coroutine, Sequence

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
    from sidecar.route_text import describe  # noqa: PLC0415

    try:
        route_map = load_config(file, env=os.environ)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    print(describe(route_map))
    return EXIT_OK


def _run(file: str, *, log_level: str | None) -> int:
    # First: a SIGTERM while the rest imports and the map loads is a clean stop, not -15.
    startup_signals.hold()
    # Imported here so that `conform` and `normalise` start without the I/O stack.
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from sidecar import logs  # noqa: PLC0415
    from sidecar.clock import Clock  # noqa: PLC0415
    from sidecar.route_files import load_config  # noqa: PLC0415
    from sidecar.service import Service  # noqa: PLC0415

    try:
        route_map = load_config(file, env=os.environ)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    # The command line (or ACEMQ_LOG_LEVEL) wins over the file's log_level; INFO otherwise.
    logs.configure(level=log_level or route_map.log_level or "INFO")
    service = Service(
        route_map,
        config_path=Path(file),
        env=os.environ,
        registry=CollectorRegistry(),
        clock=Clock.system(),
        new_id=_new_id,
        rng=random.Random(),  # noqa: S311 - backoff jitter, not security
    )
    # What start-up built lives as long as the process: keep it out of the cyclic garbage
    # collector's full passes, which otherwise pause the relay for milliseconds each.
    gc.freeze()
    try:
        return _run_loop(service.run())
    except OSError as e:  # the HTTP port is taken
        print(f"acemq-sidecar: {e}", file=sys.stderr)
        return EXIT_FAILED


def _run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop where it is installed (measured faster, see bench/), else asyncio."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def build_parser() -> argparse.ArgumentParser:
    """Describe the command line."""
    parser = argparse.ArgumentParser(
        prog="acemq-sidecar",
        description="Relay RabbitMQ messages and enforce the AceMQ envelope contract.",
    )
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
    return EXIT_USAGE  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
