# syntax=docker/dockerfile:1
#
# relay: frame-sync (lockstep) relay server.
#
#   docker build -t relay:0.1.0 .          # or podman build; the tag is pyproject.toml's version,
#                                          # the one deploy/compose and the kustomizations use
#   docker run --rm relay:0.1.0 token keygen > keys.toml     # once, the secrets: keygen runs in
#   openssl rand -hex 32 > admin-token                        # the image, no relay on the host;
#   chmod 0644 keys.toml admin-token                          # the relay (uid 10001) reads them
#   docker run --rm --stop-timeout 45 -p 7777:7777/udp -p 127.0.0.1:9100:9100 \
#       -v relay-replays:/var/lib/relay/replays \
#       -v "$PWD/keys.toml:/run/secrets/relay_keys:ro" -v "$PWD/admin-token:/run/secrets/relay_admin_token:ro" \
#       -e RELAY_SECURITY_KEYS_FILE=/run/secrets/relay_keys \
#       -e RELAY_SECURITY_ADMIN_TOKEN_FILE=/run/secrets/relay_admin_token relay:0.1.0
#
# The image serves players (UDP on 0.0.0.0), so it runs in token mode: it needs token keys and,
# its HTTP side listening beyond loopback, an admin token; without them it exits 2 saying what
# to set (docs/SECURITY.md). No secret is baked into the image. Port 9100 serves /health,
# /ready, /metrics (open) and the admin API (bearer token): publish it on a trusted interface.
# Settings: RELAY_<SECTION>_<KEY> variables (e.g. -e RELAY_SERVER_TICK_RATE=60), or mount a TOML
# file and run `serve --config /path/relay.toml`.
# tests/deploy/test_dockerfile.py checks this file's rules; tests/deploy/test_wheel.py runs the
# same wheel build and install outside Docker.

# Both stages use the same base; pinned to a patch release and Debian suite.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- builder: compiles the Cython core into a wheel, collects the dependency wheels --------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

# A C compiler for the extension modules; the dependencies come as binary wheels.
# Debian package versions are not pinned: the compiler never reaches the runtime image.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src

# Dependency wheels first: this layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
        > /tmp/requirements.txt \
    && pip wheel --no-cache-dir -w /wheels -r /tmp/requirements.txt

# Then the project itself (setuptools + Cython come from build-system.requires).
COPY setup.py README.md ./
COPY relay_core/ relay_core/
COPY relay/ relay/
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

# ---- runtime: the wheels installed on a clean slim image, no compilers ----------------------
FROM ${PYTHON_IMAGE} AS runtime

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

RUN groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --home-dir /var/lib/relay --no-create-home \
        --shell /usr/sbin/nologin relay \
    && install -d -o relay -g relay -m 0755 /var/lib/relay /var/lib/relay/replays

COPY --from=builder /wheels /tmp/wheels
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-index --find-links /tmp/wheels relay \
    && rm -rf /tmp/wheels

WORKDIR /var/lib/relay

# Game traffic and the HTTP side listen on every interface of the container (the defaults are
# loopback only); replays go to the volume.
ENV RELAY_SERVER_UDP_HOST=0.0.0.0 \
    RELAY_SERVER_HTTP_HOST=0.0.0.0 \
    RELAY_REPLAY_DIRECTORY=/var/lib/relay/replays \
    RELAY_SERVER_LOG_FORMAT=json
VOLUME ["/var/lib/relay/replays"]

USER 10001:10001

EXPOSE 7777/udp 9100/tcp

# No curl in slim images: the stdlib asks /ready (503 while draining -> unhealthy).
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('RELAY_SERVER_HTTP_PORT', '9100'), timeout=2)"]

# SIGTERM drains: readiness turns false, running matches may finish for server.drain_timeout
# (30 s, relay/config.py), then the rooms end, the replays close and relay exits 0 within
# server.shutdown_timeout (5 s). Every shipped stop grace period is 45 s = 30 + 5 + a 10 s margin
# (which also covers the Kubernetes Deployment's 5 s preStop sleep): docker run --stop-timeout 45,
# compose stop_grace_period: 45s, Kubernetes terminationGracePeriodSeconds: 45, systemd
# TimeoutStopSec=45s. Raise it together with RELAY_SERVER_DRAIN_TIMEOUT: `docker stop` otherwise
# kills the relay after 10 s, Kubernetes after 30 s, and the replays stay unfinished.
STOPSIGNAL SIGTERM
ENTRYPOINT ["relay"]
CMD ["serve"]

# Build metadata last, so that changing it rebuilds no layer above.
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="relay" \
      org.opencontainers.image.description="Frame-sync (deterministic lockstep) relay server with a compiled reliable-UDP core" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
