"""The five consumer programs: find each toolchain, build what needs building, run them.

Java is compiled with the machine's javac against the Debian RabbitMQ Java client; Go is
built offline against the Debian amqp091-go sources (GOPATH mode, no module download);
Ruby runs with the Debian Bunny; pamqp (through aiormq) and pika run in this interpreter.
A missing toolchain is a :class:`Missing` with the reason and what to install.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

HERE: Final = Path(__file__).resolve().parent / "clients"
JAVA_DIRS: Final = (Path("/usr/share/java"),)
JAVA_CLIENT_JARS: Final = ("amqp-client.jar", "rabbitmq-client.jar")
GOPATH: Final = Path("/usr/share/gocode")
AMQP091: Final = GOPATH / "src/github.com/rabbitmq/amqp091-go"
BUILD_TIMEOUT_S: Final = 180.0
RUN_TIMEOUT_S: Final = 90.0
DEBIAN: Final = {
    "java": "librabbitmq-client-java (and a JDK)",
    "go": "golang-go golang-github-rabbitmq-amqp091-go-dev",
    "ruby": "ruby-bunny",
    "pika": "pika (pip install -e '.[test]')",
    "pamqp": "aiormq (pip install -e '.[test]')",
}


@dataclass(frozen=True, slots=True)
class Missing:
    """A client that cannot run here, and why."""

    client: str
    reason: str

    def message(self) -> str:
        """The reason, with what to install."""
        return (
            f"{self.client} interop client unavailable: {self.reason}; install "
            + DEBIAN[self.client]
        )


@dataclass(frozen=True, slots=True)
class Program:
    """A ready consumer: the argv before ``AMQP_URL QUEUE...``."""

    client: str
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Output:
    """One run of a consumer: its lines by queue, and what else it said."""

    client: str
    lines: dict[str, dict[str, Any]]
    returncode: int
    stderr: str
    stray: tuple[str, ...]  # stdout lines that are not a JSON object naming a queue

    def problem(self, queues: list[str]) -> str | None:
        """Why this run cannot be read for ``queues`` (crashed, or lines missing), else None."""
        missing = [queue for queue in queues if queue not in self.lines]
        if self.returncode == 0 and not missing and not self.stray:
            return None
        return (
            f"{self.client} consumer exited {self.returncode}; {len(missing)} of {len(queues)} "
            f"lines missing (first: {missing[:3]}); stray output: {list(self.stray[:3])}\n"
            f"stderr:\n{self.stderr[-3000:]}"
        )


def _run(argv: list[str], *, env: dict[str, str] | None = None) -> str | None:
    """Run a build step; return None on success, else what it printed."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{argv[0]}: {e}"
    if done.returncode == 0:
        return None
    return f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}"


def _java(build: Path) -> Program | Missing:
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        return Missing("java", "no java/javac on PATH")
    jar = next(
        (d / name for d in JAVA_DIRS for name in JAVA_CLIENT_JARS if (d / name).is_file()), None
    )
    if jar is None:
        return Missing("java", f"no {' or '.join(JAVA_CLIENT_JARS)} in /usr/share/java")
    logging = [jar.parent / name for name in ("slf4j-api.jar", "slf4j-nop.jar")]  # slf4j
    classpath = [str(jar), *(str(path) for path in logging if path.is_file())]
    out = build / "java"
    out.mkdir(parents=True, exist_ok=True)
    source = HERE / "java" / "InteropConsumer.java"
    failed = _run([javac, "-d", str(out), "-cp", ":".join(classpath), str(source)])
    if failed:
        raise RuntimeError(f"the Java interop client does not compile:\n{failed}")
    return Program("java", (java, "-cp", ":".join([*classpath, str(out)]), "InteropConsumer"))


def _go(build: Path) -> Program | Missing:
    go = shutil.which("go")
    if go is None:
        return Missing("go", "no go on PATH")
    if not AMQP091.is_dir():
        return Missing("go", f"no amqp091-go sources at {AMQP091}")
    binary = build / "go" / "interop-go"
    binary.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GO111MODULE": "off",  # GOPATH mode: the Debian sources, no module download
        "GOPATH": str(GOPATH),
        "GOFLAGS": "",
        "GOCACHE": str(build / "go" / "cache"),
    }
    failed = _run(
        [go, "build", "-o", str(binary), str(HERE / "go" / "main.go")],
        env=env,
    )
    if failed:
        raise RuntimeError(f"the Go interop client does not build:\n{failed}")
    return Program("go", (str(binary),))


def _ruby(_build: Path) -> Program | Missing:
    ruby = shutil.which("ruby")
    if ruby is None:
        return Missing("ruby", "no ruby on PATH")
    if _run([ruby, "-e", 'require "bunny"']) is not None:
        return Missing("ruby", "ruby cannot require bunny")
    return Program("ruby", (ruby, str(HERE / "ruby" / "consume.rb")))


def _python(client: str, module: str, script: str) -> Program | Missing:
    if _run([sys.executable, "-c", f"import {module}"]) is not None:
        return Missing(client, f"{sys.executable} cannot import {module}")
    return Program(client, (sys.executable, str(HERE / "python" / script)))


def prepare(client: str, build: Path) -> Program | Missing:
    """Find and build one client's consumer under ``build``."""
    if client == "java":
        return _java(build)
    if client == "go":
        return _go(build)
    if client == "ruby":
        return _ruby(build)
    if client == "pamqp":
        return _python("pamqp", "aiormq", "consume_pamqp.py")
    if client == "pika":
        return _python("pika", "pika", "consume_pika.py")
    raise ValueError(client)


def client_url(url: str) -> str:
    """The broker URL with the vhost spelt out: Java and Bunny read a bare ``/`` as vhost ""."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/%2F")
    return urlunsplit(parts)


async def consume(program: Program, url: str, queues: list[str]) -> Output:
    """Run a consumer over ``queues``; collect one parsed line per queue."""
    process = await asyncio.create_subprocess_exec(
        *program.argv,
        client_url(url),
        *queues,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        stdout, stderr = await process.communicate()
    lines: dict[str, dict[str, Any]] = {}
    stray: list[str] = []
    for text in stdout.decode(errors="replace").splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            stray.append(text)
            continue
        if isinstance(line, dict) and isinstance(line.get("queue"), str):
            lines[line["queue"]] = line
        else:
            stray.append(text)
    return Output(
        client=program.client,
        lines=lines,
        returncode=process.returncode if process.returncode is not None else -1,
        stderr=stderr.decode(errors="replace"),
        stray=tuple(stray),
    )
