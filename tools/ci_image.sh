#!/usr/bin/env bash
# Builds the relay image from the repository's Dockerfile with podman and smoke-tests it:
# token mode with keys and an admin token mounted as files, /health and /ready, the admin API
# behind its token, bots playing with minted connect tokens (0 gaps), then SIGTERM: /ready turns
# 503, the match ends at the drain deadline, the replays close, the container exits 0.
#
# Needs root, podman, runc and (unless the base image is cached) mmdebstrap; nothing else on
# the host: keygen, minting and the bots run from the image under test. A missing tool fails.
# Run by .ci/run; alone: tools/ci_image.sh. Each failure is one line starting "ci_image: FAIL".
#
# Environment:
#   CI_PYTHON_IMAGE  base image for --build-arg PYTHON_IMAGE (default: the stand-in below, built
#                    once with mmdebstrap and kept in podman's storage)
#   CI_IMAGE_KEEP=1  keep the work directory (keys, logs, replays) for a look afterwards
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
say() { echo "ci_image: $*"; }
fail() {
    echo "ci_image: FAIL: $*" >&2
    if [ -n "${relay_name:-}" ] && podman container exists "$relay_name" 2>/dev/null; then
        echo "ci_image: last lines of the relay's log:" >&2
        podman logs --tail 15 "$relay_name" 2>&1 | sed 's/^/    /' >&2 || true
    fi
    exit 1
}

[ "$(id -u)" = 0 ] || fail "run as root (rootful podman, as in CI)"
for tool in podman runc python3; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool not installed (apt-get install podman runc mmdebstrap)"
done

work=$(mktemp -d /tmp/relay-ci-image.XXXXXX)
relay_name="relay-ci-$$"
drain_bot="relay-ci-bot-$$"
cleanup() {
    # One call per container: given a name that does not exist, podman rm removes none of them.
    for container in "$relay_name" "$drain_bot"; do
        podman rm -f --ignore -t 0 "$container" >/dev/null 2>&1 || true
    done
    if [ "${CI_IMAGE_KEEP:-}" = 1 ]; then say "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# podman's settings for this script only (CONTAINERS_CONF replaces every other containers.conf):
# the sandboxes CI runs in refuse setrlimit (podman's default nofile/nproc ulimits) and have no
# systemd-managed cgroup hierarchy.
export CONTAINERS_CONF="$work/containers.conf"
cat > "$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image="relay:$version"

# -- the base image ---------------------------------------------------------------------------
# A stand-in for python:3.11-slim-bookworm (the Dockerfile's base): CI reaches the Debian and
# PyPI mirrors but no container registry. Debian's python3.11 with pip, linked into /usr/local/bin
# where the official image has them, without the EXTERNALLY-MANAGED marker (the image is the
# environment). Built once; podman keeps it, so later runs skip this step.
base="${CI_PYTHON_IMAGE:-localhost/relay-ci-python:3.11-bookworm-1}"
if ! podman image exists "$base"; then
    [ -z "${CI_PYTHON_IMAGE:-}" ] || fail "CI_PYTHON_IMAGE=$base is not in podman's storage"
    command -v mmdebstrap >/dev/null 2>&1 || fail "mmdebstrap not installed (apt-get install mmdebstrap)"
    say "building the stand-in base image $base (mmdebstrap, once)"
    mmdebstrap --quiet --variant=minbase \
        --include=python3.11,python3.11-dev,python3-pip,python3-venv,ca-certificates,passwd \
        --customize-hook='rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED' \
        --customize-hook='for t in python:python3.11 python3:python3.11 pip:pip3 pip3:pip3; do ln -sf /usr/bin/${t#*:} "$1"/usr/local/bin/${t%%:*}; done' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$work/base.tar" || fail "mmdebstrap could not build the base image"
    podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        "$work/base.tar" "$base" >/dev/null || fail "podman import of the base image failed"
    rm -f "$work/base.tar"
fi

# -- the build ---------------------------------------------------------------------------------
# chroot isolation: no nested user namespaces or cgroups needed. pip inside the build reaches the
# package index the way the host does: the host's CA bundle and global pip configuration,
# read-only (the Dockerfile itself names no index or certificate).
# /etc/xdg/pip goes as a directory: its pip.conf may name files next to it (constraints).
mounts=()
for path in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf /etc/xdg/pip; do
    [ -e "$path" ] && mounts+=(-v "$path:$path:ro")
done
say "building $image"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# --format docker keeps the Dockerfile's HEALTHCHECK (the OCI format has none).
podman build --quiet --isolation chroot --pull=never --format docker "${mounts[@]}" \
    --build-arg PYTHON_IMAGE="$base" --build-arg VERSION="$version" --build-arg REVISION="$revision" \
    -t "$image" . > "$work/build.log" 2>&1 || { tail -n 25 "$work/build.log" >&2; fail "podman build of $image failed"; }
say "built $image ($(( $(date +%s) - started )) s so far)"

# -- secrets, made with the image (no relay on the host) -----------------------------------------
# One-off containers (keygen, bots) skip the image's HEALTHCHECK: podman would schedule it with
# systemd timers, which CI has not.
run() { podman --runtime runc run --rm --no-healthcheck --network=host "$@"; }
run "$image" token keygen > "$work/keys.toml" || fail "relay token keygen in the image failed"
grep -q '^1 = "' "$work/keys.toml" || fail "token keygen printed no key line: $(head -c 80 "$work/keys.toml")"
python3 -c 'import secrets; print(secrets.token_hex(32))' > "$work/admin-token"
chmod 0644 "$work/keys.toml" "$work/admin-token"     # the relay runs as uid 10001
install -d -m 0777 "$work/replays"

# Free ports picked now: other jobs may share this host's network namespace.
read -r udp_port http_port < <(python3 - <<'EOF'
import socket
udp, tcp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket()
udp.bind(("127.0.0.1", 0)); tcp.bind(("127.0.0.1", 0))
print(udp.getsockname()[1], tcp.getsockname()[1])
EOF
)
http="http://127.0.0.1:$http_port"

# -- the relay -----------------------------------------------------------------------------------
# The image's own settings (0.0.0.0, token mode, JSON logs), the secrets as files the way compose
# and Kubernetes mount them. The drain is cut to 4 s so that CI waits 4 s, not 30.
say "starting $image (UDP $udp_port, HTTP $http_port)"
podman --runtime runc run -d --name "$relay_name" --network=host \
    -v "$work/keys.toml:/run/secrets/relay_keys:ro" \
    -v "$work/admin-token:/run/secrets/relay_admin_token:ro" \
    -v "$work/replays:/var/lib/relay/replays" \
    -e RELAY_SECURITY_KEYS_FILE=/run/secrets/relay_keys \
    -e RELAY_SECURITY_ADMIN_TOKEN_FILE=/run/secrets/relay_admin_token \
    -e RELAY_SERVER_UDP_PORT="$udp_port" -e RELAY_SERVER_HTTP_PORT="$http_port" \
    -e RELAY_SERVER_DRAIN_TIMEOUT=4 \
    "$image" >/dev/null 2> "$work/run.err" || fail "podman run of $image failed: $(tail -n 3 "$work/run.err")"

# status URL [TOKEN]: the HTTP status (000 if no answer).
status() {
    python3 - "$@" <<'EOF'
import sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1])
if len(sys.argv) > 2:
    request.add_header("Authorization", "Bearer " + sys.argv[2])
try:
    print(urllib.request.urlopen(request, timeout=2).status)
except urllib.error.HTTPError as error:
    print(error.code)
except OSError:
    print("000")
EOF
}

ready=""
for _ in $(seq 1 60); do
    [ "$(podman inspect -f '{{.State.Running}}' "$relay_name")" = true ] \
        || fail "the relay exited at start (status $(podman inspect -f '{{.State.ExitCode}}' "$relay_name"))"
    if [ "$(status "$http/ready")" = 200 ]; then ready=1; break; fi
    sleep 0.5
done
[ -n "$ready" ] || fail "/ready did not answer 200 within 30 s"
[ "$(status "$http/health")" = 200 ] || fail "/health did not answer 200"
# The image's HEALTHCHECK command, run once by hand (no systemd to schedule it here); exit 0 is
# healthy.
podman healthcheck run "$relay_name" >/dev/null 2>&1 \
    || fail "the image's HEALTHCHECK does not pass on a ready relay"
# Into a file first: under pipefail, `podman logs | grep -q` fails whenever grep stops reading
# before podman has written the rest (SIGPIPE).
podman logs "$relay_name" > "$work/relay.log" 2>&1 || fail "podman logs $relay_name failed"
grep -q '"security": *"token"' "$work/relay.log" \
    || fail "the relay did not start in token mode (no security=token in its started line)"
[ "$(status "$http/rooms")" = 401 ] || fail "the admin API answered without the admin token"
[ "$(status "$http/rooms" "$(cat "$work/admin-token")")" = 200 ] \
    || fail "the admin API refused the mounted admin token"
say "ready; admin API behind the mounted token"

# -- bots ----------------------------------------------------------------------------------------
# Each bot mints its own connect token with the key, as a game backend would.
bot=(-v "$work/keys.toml:/keys.toml:ro" "$image" bot --server "127.0.0.1:$udp_port" --key-file /keys.toml --json)
run "${bot[@]}" --rooms 2 --players 2 --seconds 6 > "$work/bots.json" 2> "$work/bots.err" \
    || fail "relay bot exited non-zero: $(tail -c 300 "$work/bots.err" "$work/bots.json" | tr '\n' ' ')"
python3 - "$work/bots.json" <<'EOF' || fail "the bots' report: $(tail -c 400 "$work/bots.json")"
import json, sys
report = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
problems = [f"{key} {report[key]}" for key in ("gaps", "duplicates", "mismatches") if report[key]]
problems += report["errors"]
if report["frames_per_bot_min"] < 150:          # 5 s at the default 30 Hz
    problems.append(f"a bot got only {report['frames_per_bot_min']} frames")
if problems:
    sys.exit("; ".join(problems))
print(f"ci_image: 4 bots played: {report['frames_per_bot_min']}+ frames each, 0 gaps, "
      f"latency p99 {report['latency_ms']['p99']} ms")
EOF

# -- SIGTERM drains ------------------------------------------------------------------------------
podman --runtime runc run -d --no-healthcheck --name "$drain_bot" --network=host "${bot[@]}" --players 2 --seconds 60 >/dev/null \
    || fail "could not start the bots for the drain"
playing=""
for _ in $(seq 1 40); do
    if python3 - "$http/rooms" "$(cat "$work/admin-token")" <<'EOF'
import json, sys, urllib.request
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
rooms = json.load(urllib.request.urlopen(request, timeout=2))["rooms"]
sys.exit(0 if any(room.get("state") == "running" for room in rooms) else 1)
EOF
    then playing=1; break; fi
    sleep 0.5
done
[ -n "$playing" ] || fail "the drain bots' room never started"
sleep 1
sigterm_at=$(date +%s)
podman kill --signal TERM "$relay_name" >/dev/null || fail "podman kill --signal TERM failed"
sleep 1
[ "$(status "$http/ready")" = 503 ] || fail "/ready did not answer 503 while draining"
# Drain (4 s) + shutdown (5 s at most) + margin.
exit_code=$(timeout 30 podman wait "$relay_name") || fail "the relay did not exit within 30 s of SIGTERM"
stopped_after=$(( $(date +%s) - sigterm_at ))
[ "$exit_code" = 0 ] || fail "the relay exited $exit_code after SIGTERM, not 0"
log=$(podman logs "$relay_name" 2>&1)
grep -q '"event": *"draining"' <<<"$log" || fail "no draining event in the relay's log"
grep -q 'drain_deadline' <<<"$log" || fail "the running match did not end at the drain deadline"
grep -q '"event": *"stopped"' <<<"$log" || fail "no stopped event in the relay's log"
grep -q '"event": *"replay_closed"' <<<"$log" || fail "no replay_closed event: the replays were not closed"
[ "$stopped_after" -ge 3 ] || fail "the relay stopped ${stopped_after} s after SIGTERM: it did not drain"
ls "$work"/replays/*.replay >/dev/null 2>&1 || fail "no replay written to the mounted volume"
say "SIGTERM: drained, exited 0 after ${stopped_after} s; $(ls "$work"/replays/*.replay | wc -l) replays written"

say "OK: $image built and smoke-tested in $(( $(date +%s) - started )) s"
