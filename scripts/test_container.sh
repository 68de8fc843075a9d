#!/usr/bin/env bash
# Builds docker/Dockerfile.cpu with rootful podman and checks the image end to end: /health,
# a greedy completion on stories260K (with LLM_API_KEY from the environment), a gRPC stream
# (tests/clients/grpc_client_test.py), the image's HEALTHCHECK and its non-root user.
# No registry is reachable here, so the base image is made with debootstrap and cached in
# the scratch folder (see ../shared/CONTAINERS.md for why runc, cgroupfs and explicit ulimits).
# Usage (as root): scripts/test_container.sh [--prepare]   [LLM_CONTAINER_STATE=/tmp/llm-container-test]
#   --prepare  only make what does not depend on the sources: the base image and the image's
#              build-deps stage (its apt-get layer, cached by podman). Mostly downloads and
#              unpacking: scripts/test.sh runs it in the background during the fuzz stage, so
#              that the container stage then starts at the compile.
set -euo pipefail
prepare_only=""
[ "${1:-}" = --prepare ] && prepare_only=1
cd "$(dirname "$0")/.."
repo=$(pwd)
model=$(cd "$repo/../shared/models/stories260K" && pwd)
state=${LLM_CONTAINER_STATE:-/tmp/llm-container-test}
image=localhost/llm:cpu
base=localhost/debian:bookworm
name=llm-container-test-$$
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
start=$(date +%s)

# ---- tools ---------------------------------------------------------------------------------
LLM_DEPS=container scripts/deps.sh

# ---- podman configuration: all state under $state -------------------------------------------
mkdir -p "$state/storage" "$state/run" "$state/tmp"
cat >"$state/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$state/events.log"
CONF
cat >"$state/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$state/storage"
runroot = "$state/run"
CONF
export CONTAINERS_CONF=$state/containers.conf CONTAINERS_STORAGE_CONF=$state/storage.conf
export TMPDIR=$state/tmp

cleanup() {
  podman rm -f -t 2 "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ---- base image (cached across runs) ----------------------------------------------------
if ! podman image exists "$base"; then
  t0=$(date +%s)
  sources=/etc/apt/sources.list.d/debian.sources
  mirror=$(awk '/^URIs:/ {print $2; exit}' "$sources" 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$state/rootfs
  rm -rf "$rootfs"
  echo "[container] debootstrap bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$state/debootstrap.log" 2>&1 \
    || { tail -20 "$state/debootstrap.log"; exit 1; }
  if [ -f "$sources" ]; then
    mkdir -p "$rootfs/etc/apt/sources.list.d"
    cp "$sources" "$rootfs/etc/apt/sources.list.d/debian.sources"
    rm -f "$rootfs/etc/apt/sources.list"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import - "$base" >/dev/null
  rm -rf "$rootfs"
  echo "[container] base image $base made in $(($(date +%s) - t0)) s"
else
  echo "[container] base image $base cached"
fi

# ---- the build-deps stage (packages only; the full build below reuses its cached layers) --
t0=$(date +%s)
if podman build --format docker --build-arg BASE_IMAGE="$base" -f docker/Dockerfile.cpu \
     --target build-deps -t localhost/llm:cpu-build-deps . >"$state/build-deps.log" 2>&1; then
  echo "[container] build-deps stage in $(($(date +%s) - t0)) s"
else
  tail -40 "$state/build-deps.log"
  fail "podman build --target build-deps (log: $state/build-deps.log)"
  echo "$passed passed, $failed failed"
  exit 1
fi
if [ -n "$prepare_only" ]; then
  echo "[container] prepared in $(($(date +%s) - start)) s"
  exit 0
fi

# ---- build ------------------------------------------------------------------------------
t0=$(date +%s)
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
if podman build --format docker --build-arg BASE_IMAGE="$base" -f docker/Dockerfile.cpu \
     -t "$image" . >"$state/build.log" 2>&1; then
  ok "image built in $(($(date +%s) - t0)) s ($(podman image inspect "$image" --format '{{.Size}}' \
     | awk '{printf "%.0f MB", $1 / 1e6}'))"
else
  tail -40 "$state/build.log"
  fail "podman build (log: $state/build.log)"
  echo "$passed passed, $failed failed"
  exit 1
fi

# ---- run --------------------------------------------------------------------------------
read -r http_port grpc_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
key=container-test-key
# Only the ports are given: host 0.0.0.0 and --model /models/model are the image's defaults.
podman run -d --name "$name" --network=host -e LLM_API_KEY="$key" \
  -v "$model:/models/model:ro" "$image" --port "$http_port" --grpc-port "$grpc_port" \
  --kv-cache-mb 64 >/dev/null 2>"$state/run.err"  # (podman warns: no systemd for health timers)

healthy=""
for _ in $(seq 1 120); do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/health")" = 200 ]; then
    healthy=1
    break
  fi
  [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] || break
  sleep 0.5
done
if [ -n "$healthy" ]; then ok "/health 200"; else
  podman logs "$name" 2>&1 | tail -20
  fail "/health never answered 200"
  echo "$passed passed, $failed failed"
  exit 1
fi

body='{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}'
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/v1/completions" -d "$body")
[ "$code" = 401 ] && ok "completion without the key: 401" || fail "completion without the key: $code"
text=$(curl -s "http://127.0.0.1:$http_port/v1/completions" -H "Authorization: Bearer $key" \
  -d "$body" | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])' \
  || true)
if [[ $text == ", there was a little girl named Lily"* ]]; then ok "completion: $text"; else
  fail "completion: '$text'"
fi

# The llm_client package (clients/python) from a copy of the source tree, its stubs generated
# by its own build_stubs.py (protoc + grpc_python_plugin), on Debian's python3-grpcio.
pkg=$state/python-pkg
rm -rf "$pkg" && mkdir -p "$pkg"
cp -r clients/python/llm_client "$pkg/"
/usr/bin/python3 clients/python/build_stubs.py --root "$pkg" --proto proto/llm.proto > /dev/null
# The server has an API key, and gRPC needs it too (metadata authorization: Bearer KEY).
if LLM_API_KEY="$key" PYTHONPATH="$pkg" /usr/bin/python3 tests/clients/grpc_client_test.py "127.0.0.1:$grpc_port"; then
  ok "gRPC client (stream, health, tokenize, errors)"
else
  fail "gRPC client"
fi

if podman healthcheck run "$name" >/dev/null 2>&1; then ok "HEALTHCHECK healthy"; else
  fail "HEALTHCHECK (podman healthcheck run $name)"
fi
uid=$(podman exec "$name" id -u 2>/dev/null || echo "?")
[ "$uid" = 10001 ] && ok "runs as uid 10001" || fail "runs as uid $uid"

podman rm -f -t 10 "$name" >/dev/null 2>&1 && ok "container removed" || fail "podman rm"
echo "[container] total $(($(date +%s) - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
