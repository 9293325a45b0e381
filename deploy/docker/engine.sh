#!/usr/bin/env bash
# Makes sure a Docker engine answers on this machine, and that docker-compose and debootstrap are here.
#
# Idempotent: an engine that already answers is left alone (only missing tools are installed).
# Otherwise the Debian packages that are missing (docker.io, docker-compose, debootstrap) are installed
# non-interactively and dockerd is started in the background with the vfs storage driver (overlayfs
# does not work inside this machine's own container), logging to $GROUPER_DOCKERD_LOG.
# Waits at most $GROUPER_ENGINE_WAIT_S seconds for the engine to answer; exits non-zero with the reason
# and the tail of the daemon log if it does not.
set -euo pipefail

WAIT_S="${GROUPER_ENGINE_WAIT_S:-60}"
DOCKERD_LOG="${GROUPER_DOCKERD_LOG:-/var/log/grouper-dockerd.log}"

say() { echo "engine.sh: $*" >&2; }
fail() { say "$*"; exit 1; }

engine_answers() {
    # `docker version` asks the server too; a client newer than the engine negotiates the API down
    command -v docker >/dev/null 2>&1 && docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

install_missing() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || fail "missing ${missing[*]}; run this script as root so it can apt-get install them"
    say "installing ${missing[*]} from apt"
    export DEBIAN_FRONTEND=noninteractive
    # an index older than the packages' versions makes apt fetch 404s: refresh it once on failure
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
        apt-get update -q >/dev/null || fail "apt-get update failed; is the Debian mirror reachable?"
        apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
            || fail "apt-get install ${missing[*]} failed (see the output above)"
    fi
}

install_missing

if engine_answers; then
    exit 0
fi

[ "$(id -u)" -eq 0 ] || fail "no Docker engine answers and starting dockerd needs root"
command -v dockerd >/dev/null 2>&1 || fail "dockerd is not installed even after apt-get (package docker.io)"

# the engine needs containerd; Debian's docker.io brings it as a dependency and dockerd starts its own
say "starting dockerd (storage driver vfs), log in $DOCKERD_LOG"
mkdir -p "$(dirname "$DOCKERD_LOG")"
nohup dockerd --storage-driver=vfs >>"$DOCKERD_LOG" 2>&1 </dev/null &
dockerd_pid=$!

deadline=$((SECONDS + WAIT_S))
until engine_answers; do
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        fail "dockerd exited before answering (last lines of $DOCKERD_LOG above)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        fail "dockerd did not answer within ${WAIT_S} s (last lines of $DOCKERD_LOG above)"
    fi
    sleep 0.5
done
say "engine $(docker version --format '{{.Server.Version}}') answers"
