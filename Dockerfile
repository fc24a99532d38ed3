# schedext container image.
#
#   docker build -t ghcr.io/schedext/schedext:0.1.0 .
#   docker run --rm -p 127.0.0.1:8888:8888 ghcr.io/schedext/schedext:0.1.0 \
#       --host 0.0.0.0 --insecure-allow-remote      # demo inventory, reachable from the host
#
# Two stages: the builder installs schedext and its dependencies into a virtual environment
# (every dependency ships manylinux wheels for CPython 3.11; a C compiler is there only for
# schedext's own small extension, extender/_packed.c, the fast path of filter and prioritize);
# the final stage is the same slim Python base with only that environment copied in.
# Both stages must use the same base: the environment's python is a symlink to the base's
# interpreter. Pin it by digest in CI (PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies first, in their own layer, so that a code change does not reinstall them. The
# list comes from pyproject.toml itself (tomllib is in the 3.11 standard library), so there
# is no second list to keep in sync. --only-binary: fail instead of compiling anything.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --only-binary=:all: -r /tmp/requirements.txt

# Then schedext itself, as a wheel built from the source (not an editable install: the final
# stage gets no source tree). README.md is the package's long description. Afterwards:
# - the installers leave the environment, since nothing installs packages at run time;
# - everything is compiled to bytecode that is validated by hash, never by timestamp
#   (-f: pip already wrote timestamp-validated .pyc files): the root filesystem is read-only
#   at run time, so Python must never need to (re)write a .pyc there.
COPY README.md setup.py ./
COPY app ./app
COPY extender ./extender
RUN pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && pip install --only-binary=:all: /tmp/wheels/schedext-*.whl \
    && (cd / && python -c "import extender._packed") \
    && pip uninstall --yes pip setuptools \
    && python -m compileall -q -f --invalidation-mode unchecked-hash /opt/venv/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="schedext" \
      org.opencontainers.image.description="Kubernetes scheduler extender: GPU topology, IP pools and gangs" \
      org.opencontainers.image.source="https://github.com/schedext/schedext" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/venv /opt/venv
# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only (readOnlyRootFilesystem), and
# schedext writes no files of its own: no cache, no temp files, logs go to stdout.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric non-root user (the distroless "nonroot" UID), so that Kubernetes' runAsNonRoot
# can verify it without an /etc/passwd entry.
USER 65532:65532
EXPOSE 8888
# /healthz over plain HTTP on the default address, for `docker run`. In Kubernetes the pod's
# probes are used instead (see manifests/); HEALTHCHECK_URL points this elsewhere. Python,
# because the slim base has no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('HEALTHCHECK_URL', 'http://127.0.0.1:8888/healthz'), timeout=4)"]
# One process, one uvicorn worker (the CLI's own choice): the inventory lives in the process.
ENTRYPOINT ["schedext", "serve"]
