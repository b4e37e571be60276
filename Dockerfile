# syntax=docker/dockerfile:1
# acemq-sidecar: build the wheel, install it and its locked dependencies into a virtual
# environment, and copy only that environment into a clean image of the same Python. The
# final image has no compiler, no build backend, no pip or setuptools and no pip cache; it
# runs as 10001 and writes nothing at run time, so it works with a read-only root
# filesystem.
#
#   docker build -t acemq-sidecar:0.1.0 .      # or: podman build -t acemq-sidecar:0.1.0 .
#   docker run --rm -v "$PWD/config/example.yaml:/etc/acemq-sidecar/routes.yaml:ro" \
#     -e AMQP_URL=amqp://guest:guest@host.docker.internal:5672/ -p 9090:9090 \
#     -e ACEMQ_HTTP_LISTEN=0.0.0.0:9090 --read-only acemq-sidecar:0.1.0

# One pinned Python for both stages: the virtual environment's interpreter is a link to
# the base image's, so the stages must match exactly. The tag says which Python; the
# digest (the tag's multi-platform index) is what is pulled, so a rebuilt tag changes
# nothing until this line does (docs/kubernetes.md, "The image", says how to renew it).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Everything the image installs is pinned with hashes in requirements/ (regenerate with
# the commands in docs/kubernetes.md, "The image"): the build backend and the compiler
# for this stage here, the dependencies of the runtime environment after them, so that a
# bump of requirements/image.txt reuses the compiler's layer.
COPY requirements/image-build.txt requirements/image-compile.txt ./requirements/
# The tools of this stage, before any source: a code change reuses these layers. gcc is
# the base image's Debian release's, not pinned further (its old versions leave the
# mirror); mypy (mypyc) and setuptools come from requirements/image-compile.txt, the
# build backend from requirements/image-build.txt. None of it reaches the final image.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir --require-hashes -r requirements/image-build.txt \
 && pip install --no-cache-dir --require-hashes -r requirements/image-compile.txt
# The environment is made without pip; this stage's pip installs the locked dependencies
# into it, hash-checked. Every dependency ships binary wheels for CPython 3.11 on amd64
# and arm64; pip compiles the .pyc files here, at build time.
COPY requirements/image.txt ./requirements/
RUN python -m venv --without-pip /opt/acemq-sidecar \
 && pip --python /opt/acemq-sidecar/bin/python install --no-cache-dir --require-hashes \
      -r requirements/image.txt
# .dockerignore lets in only what the wheel is built from, and the compile step.
COPY pyproject.toml README.md hatch_build.py ./
COPY sidecar ./sidecar
COPY scripts/compile ./scripts/compile
# The wheel is built with the pinned backend (no isolated, unpinned download), plain
# (ACEMQ_SIDECAR_PURE: the compile step below builds the same modules), and installed
# alone, so it cannot pull in anything the lock does not name. Then the compiled build:
# the hot modules (pyproject.toml names them) compiled with mypyc in the environment, next
# to their sources, which Python then no longer imports, against the types of the
# environment's own dependencies (docs/performance.md).
RUN ACEMQ_SIDECAR_PURE=1 pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
 && pip --python /opt/acemq-sidecar/bin/python install --no-cache-dir --no-deps \
      /wheels/acemq_sidecar-*.whl \
 && PYTHON=python scripts/compile --in /opt/acemq-sidecar/lib/python3.11/site-packages \
      --deps /opt/acemq-sidecar/bin/python \
 && /opt/acemq-sidecar/bin/acemq-sidecar --help >/dev/null

FROM ${PYTHON_IMAGE}
# What a CI passes: --build-arg VERSION=<the release> (a test keeps this default equal to
# pyproject.toml's version), REVISION=$(git rev-parse HEAD), CREATED=<RFC 3339 time of
# the build> and SOURCE=<the repository's URL>, for the OCI labels below.
ARG VERSION=0.1.0
ARG REVISION=""
ARG CREATED=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="acemq-sidecar" \
      org.opencontainers.image.description="Enforces the AceMQ envelope wire contract between applications and RabbitMQ." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
# No .pyc writes at run time (they were compiled at build time), unbuffered logs.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/acemq-sidecar/bin:${PATH}
# A named user for tools that look the uid up; the numeric USER below is what Kubernetes'
# runAsNonRoot can verify. The base image's installers go: pip, setuptools and wheel, and
# the copies ensurepip would reinstall them from. Nothing at run time installs anything.
RUN groupadd --system --gid 10001 acemq \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin acemq \
 && rm -rf /usr/local/lib/python3.11/site-packages/pip \
      /usr/local/lib/python3.11/site-packages/pip-*.dist-info \
      /usr/local/lib/python3.11/site-packages/setuptools \
      /usr/local/lib/python3.11/site-packages/setuptools-*.dist-info \
      /usr/local/lib/python3.11/site-packages/pkg_resources \
      /usr/local/lib/python3.11/site-packages/_distutils_hack \
      /usr/local/lib/python3.11/site-packages/distutils-precedence.pth \
      /usr/local/lib/python3.11/site-packages/wheel \
      /usr/local/lib/python3.11/site-packages/wheel-*.dist-info \
      /usr/local/lib/python3.11/ensurepip/_bundled \
      /usr/local/bin/pip /usr/local/bin/pip3 /usr/local/bin/pip3.11 /usr/local/bin/wheel
COPY --from=build /opt/acemq-sidecar /opt/acemq-sidecar
USER 10001:10001
# /metrics, /healthz, /readyz (route map http.listen; the default is 0.0.0.0:9090).
EXPOSE 9090
# Exec form, no shell and no init: the Python process is PID 1 and receives SIGTERM itself.
# The sidecar installs its own SIGTERM/SIGINT/SIGHUP handlers (as PID 1 an unhandled
# SIGTERM would be ignored) and starts no child processes, so there is nothing to reap.
STOPSIGNAL SIGTERM
ENTRYPOINT ["acemq-sidecar", "run"]
CMD ["--config", "/etc/acemq-sidecar/routes.yaml"]
