# syntax=docker/dockerfile:1
#
# One image for every Berth process: the API (the default command), the control-plane worker
# (`berth worker control`) and the node agents (`berth worker node --node-id N`). docker-compose.yml runs each with
# its own command; every setting comes from BERTH_* environment variables (config/settings.py).
#
# Built to come out the same twice from one commit: every Python package comes from requirements.lock (one version
# each, checked against its hashes, wheels only: nothing compiled here), the final stage holds only the virtual
# environment, the example fleet and a fixed user, and bytecode is compiled by content hash, not by file time.
# For a bit-identical rebuild also pin the base by digest and clamp file times (deploy/README.md, "The image").
ARG PYTHON_IMAGE=python:3.11-slim
# Berth's version, as pyproject.toml says it: the build stage refuses to go on when the two differ, so the final
# image's version label is the version its `berth` reports.
ARG VERSION=0.1.0

FROM ${PYTHON_IMAGE} AS build
ARG VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# No pip inside: the base image's pip installs into it (--python), so the final image carries no installer, and no
# bytecode compiled by file time (ensurepip's) to differ from one build to the next.
RUN python -m venv --without-pip /opt/venv
# The lock alone first, so a change to Berth's code rebuilds only the layers after it.
COPY requirements.lock /src/requirements.lock
RUN pip --python /opt/venv/bin/python install --require-hashes --only-binary=:all: --no-compile \
        -r /src/requirements.lock
COPY . /src
# Berth itself with its server extra (the control plane: the lock above is resolved with it), built with the locked
# setuptools (no build isolation: it would fetch an unpinned one) and nothing else (no index, no dependencies: they
# are all installed above).
RUN pip --python /opt/venv/bin/python install --no-deps --no-build-isolation --no-index --no-compile '/src[server]' \
    && pip --python /opt/venv/bin/python check \
    && installed="$(/opt/venv/bin/python -c 'import importlib.metadata as m; print(m.version("berth"))')" \
    && if [ "$installed" != "$VERSION" ]; then \
        echo "pyproject.toml says berth $installed, the Dockerfile's VERSION says $VERSION: make them agree" >&2; \
        exit 1; \
    fi \
    && /opt/venv/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/venv/lib

FROM ${PYTHON_IMAGE}
ARG VERSION
LABEL org.opencontainers.image.title="berth" \
      org.opencontainers.image.description="Berth, a GPU capacity control plane: API, workers, node gateway, agent" \
      org.opencontainers.image.version="${VERSION}"

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    BERTH_STATE_DIR=/var/lib/berth

# A fixed uid, so a volume written by one build stays writable by the next, and numeric in USER so Kubernetes'
# runAsNonRoot can check it. Written into passwd and group directly: useradd would also stamp today's date into
# /etc/shadow, and the image would differ from day to day. Node agents keep their lease files in /var/lib/berth:
# mount a volume on it so leases outlive the container.
RUN echo 'berth:x:10001:10001:Berth:/var/lib/berth:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'berth:x:10001:' >> /etc/group \
    && install --directory --owner 10001 --group 10001 --mode 0750 /var/lib/berth

COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The fleet the compose file's simulated hosts serve (BERTH_FLEET_FILE, `berth apply -f`).
COPY examples/ /app/examples/

USER 10001:10001
EXPOSE 8000
CMD ["uvicorn", "--factory", "api.app:create_app", "--host", "0.0.0.0", "--port", "8000"]
