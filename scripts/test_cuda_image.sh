#!/usr/bin/env bash
# Builds the CUDA image (docker/Dockerfile, unchanged) with rootful podman and checks it end to
# end with --device cpu: /health, a greedy completion on stories260K, the image's HEALTHCHECK,
# its non-root user, `llm serve --help`, the CUDA libraries it loads, and that --device cuda
# fails with a clear error when there is no GPU.
# NVIDIA's base images cannot be pulled here, so the two bases the Dockerfile names are made
# here and tagged with those names (cached in the scratch folder):
#   devel:   debootstrapped Debian 12 + this machine's CUDA toolkit (LLM_CUDA_HOME, default
#            /usr/local/cuda; cuDNN left out, as in NVIDIA's -devel tag), nvcc on the PATH,
#            the libraries in ld.so.conf;
#   runtime: debootstrapped Debian 12 + only the CUDA libraries `llm` loads (ldd in the build
#            stage; cudart, cuBLAS, cuBLASLt and NCCL at least, as NVIDIA's -runtime has).
# The toolkit's major.minor must match the tag's. Podman setup as in scripts/test_container.sh
# (../shared/CONTAINERS.md: runc, cgroupfs, explicit ulimits); builds run under nice -n 19 with
# LLM_BUILD_JOBS (default 2) compile jobs, and everything uses the host network.
# Too slow for CI's container stage: run before each release (docker/README.md).
# Usage (as root): scripts/test_cuda_image.sh   [LLM_CUDA_IMAGE_STATE=/tmp/llm-cuda-image]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
model=$(cd "$repo/../shared/models/stories260K" && pwd)
state=${LLM_CUDA_IMAGE_STATE:-/tmp/llm-cuda-image}
cuda_home=$(readlink -f "${LLM_CUDA_HOME:-/usr/local/cuda}")
jobs=${LLM_BUILD_JOBS:-2}
image=localhost/llm:cuda
build_image=localhost/llm-cuda-build
name=llm-cuda-image-test-$$
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
now() { date +%s; }
summary() {
  echo "[cuda-image] timings: ${timings:-} total $(($(now) - start)) s"
  echo "$passed passed, $failed failed"
}
die() {  # die MESSAGE: a failure the later checks cannot go past
  fail "$*"
  summary
  exit 1
}
mb() { podman image inspect "$1" --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}'; }
start=$(now)
timings=""

# ---- build context ------------------------------------------------------------------------
# The build context is a snapshot of the working tree (the files git tracks or would add), so
# that edits made during the half hour of compiling change neither the build stage nor the
# image after it (they would miss the build stage's cached layers and compile everything again).
ctx=$state/context
rm -rf "$ctx" && mkdir -p "$ctx"   # (deleted files git still tracks are left out)
git ls-files -z -co --exclude-standard \
  | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done \
  | tar --null -T - -cf - | tar -C "$ctx" -xf -
dirty=$(git diff --quiet HEAD || echo ' + uncommitted changes')
echo "[cuda-image] context: $(git rev-parse --short HEAD)$dirty"

# ---- the bases the Dockerfile names, and the toolkit that must match them ------------------
devel=$(sed -n 's/^ARG BASE_IMAGE=//p' "$ctx/docker/Dockerfile")
runtime=$(sed -n 's/^ARG RUNTIME_IMAGE=//p' "$ctx/docker/Dockerfile")
[[ $devel == nvidia/cuda:* && $runtime == nvidia/cuda:* ]] \
  || die "docker/Dockerfile's bases are not nvidia/cuda images ('$devel', '$runtime')"
cuda_version=${devel#nvidia/cuda:}
cuda_version=${cuda_version%%-*}            # 13.0.2
[ -x "$cuda_home/bin/nvcc" ] || die "no nvcc in $cuda_home (set LLM_CUDA_HOME)"
nvcc_release=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[ "$nvcc_release" = "${cuda_version%.*}" ] \
  || die "the toolkit in $cuda_home is CUDA $nvcc_release, the Dockerfile's bases $cuda_version"
echo "[cuda-image] $devel / $runtime from $cuda_home (nvcc $("$cuda_home/bin/nvcc" --version \
  | sed -n 's/.*, V//p'))"

# ---- tools ---------------------------------------------------------------------------------
LLM_DEPS=container scripts/deps.sh

# ---- podman configuration: all state under $state -------------------------------------------
mkdir -p "$state/storage" "$state/run" "$state/tmp" "$state/libpod"
cat >"$state/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$state/events.log"
tmp_dir = "$state/libpod"
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
  podman rm -f -t 2 "$name" "$name-cuda" >/dev/null 2>&1 || true
  rm -rf "$state/rootfs"
}
trap cleanup EXIT
# Working containers an interrupted `podman build` left in this storage (only this script's).
for id in $(podman ps -aq --external); do podman rm -f "$id" >/dev/null 2>&1 || true; done

# ---- Debian 12 (debootstrap, cached as a tarball of the root file system) -----------------------
debian=$state/bookworm-rootfs.tar
if [ ! -f "$debian" ]; then
  t0=$(now)
  sources=/etc/apt/sources.list.d/debian.sources
  mirror=$(awk '/^URIs:/ {print $2; exit}' "$sources" 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$state/rootfs
  rm -rf "$rootfs"
  echo "[cuda-image] debootstrap bookworm from $mirror"
  nice -n 19 debootstrap --variant=minbase bookworm "$rootfs" "$mirror" \
    >"$state/debootstrap.log" 2>&1 || { tail -20 "$state/debootstrap.log"; die "debootstrap"; }
  if [ -f "$sources" ]; then
    mkdir -p "$rootfs/etc/apt/sources.list.d"
    cp "$sources" "$rootfs/etc/apt/sources.list.d/debian.sources"
    rm -f "$rootfs/etc/apt/sources.list"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -cf "$debian.part" . && mv "$debian.part" "$debian"
  rm -rf "$rootfs"
  timings+="debootstrap $(($(now) - t0)) s, "
fi

# stand_in TAG LABEL-VALUE COPY-FUNCTION ENV...: Debian 12 plus what COPY-FUNCTION puts into the
# root file system given as its argument, imported as docker.io/TAG and tagged localhost/TAG.
stand_in() {
  local tag=$1 label=$2 copy=$3 rootfs=$state/rootfs
  shift 3
  local changes=(--change "LABEL llm.stand-in=$label")
  for e in "$@"; do changes+=(--change "ENV $e"); done
  rm -rf "$rootfs" && mkdir -p "$rootfs"
  tar -C "$rootfs" -xf "$debian"
  "$copy" "$rootfs"
  ln -sfn "${cuda_home##*/}" "$rootfs/usr/local/cuda"
  echo /usr/local/cuda/lib64 >"$rootfs/etc/ld.so.conf.d/988_cuda.conf"
  ldconfig -r "$rootfs"
  tar -C "$rootfs" -c . | nice -n 19 podman import "${changes[@]}" - "docker.io/$tag" \
    >"$state/import.log" 2>&1 || { tail -5 "$state/import.log"; die "podman import $tag"; }
  podman tag "docker.io/$tag" "localhost/$tag"
  rm -rf "$rootfs"
}
# The environment NVIDIA's images set (the driver's folders under /usr/local/nvidia are mounted
# by the NVIDIA container toolkit).
debian_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
nv_env=("NVIDIA_VISIBLE_DEVICES=all" "NVIDIA_DRIVER_CAPABILITIES=compute,utility"
  "CUDA_VERSION=$cuda_version" "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
  "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:$debian_path")

# ---- stand-in devel base: the whole toolkit but cuDNN ----------------------------------------
copy_toolkit() {
  mkdir -p "$1/usr/local"
  tar -C "${cuda_home%/*}" --exclude='libcudnn*' -c "${cuda_home##*/}" | tar -C "$1/usr/local" -x
}
stand_in_label() {
  podman image inspect "docker.io/$1" --format '{{index .Labels "llm.stand-in"}}'
}
if [ "$(stand_in_label "$devel" 2>/dev/null)" != "toolkit $cuda_home" ]; then
  t0=$(now)
  echo "[cuda-image] making $devel (Debian 12 + $cuda_home)"
  stand_in "$devel" "toolkit $cuda_home" copy_toolkit "${nv_env[@]}" \
    "LIBRARY_PATH=/usr/local/cuda/lib64/stubs"
  timings+="devel base $(($(now) - t0)) s, "
fi

# ---- build stage --------------------------------------------------------------------------
build() {  # build LOG ARGS...: podman build of docker/Dockerfile, niced, stand-ins only
  local log=$1
  shift
  # --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
  nice -n 19 podman build --format docker --pull=never --network=host \
    --build-arg LLM_BUILD_JOBS="$jobs" -f "$ctx/docker/Dockerfile" "$@" "$ctx" >"$log" 2>&1
}
t0=$(now)
if build "$state/build-stage.log" --target build -t "$build_image"; then
  ok "build stage built in $(($(now) - t0)) s (nvcc, ${jobs} jobs)"
  timings+="build stage $(($(now) - t0)) s, "
else
  tail -40 "$state/build-stage.log"
  die "podman build --target build (log: $state/build-stage.log)"
fi

# The CUDA libraries build/llm loads (ldd in the build stage), and the ones NVIDIA's runtime
# image always has; their files (soname and the links next to it) go into the runtime base.
mapfile -t linked < <(podman run --rm --network=host "$build_image" ldd /src/build/llm \
  | awk -v c="$cuda_home" '$3 ~ "^(/usr/local/cuda|" c ")/" {print $1}')
major=${cuda_version%%.*}
mapfile -t cuda_libs < <(printf '%s\n' "${linked[@]}" "libcudart.so.$major" "libcublas.so.$major" \
  "libcublasLt.so.$major" libnccl.so.2 | sort -u)
echo "[cuda-image] build/llm loads from the toolkit: ${linked[*]}"
copy_libs() {
  mkdir -p "$1$cuda_home/lib64"
  local l
  for l in "${cuda_libs[@]}"; do cp -a "$cuda_home/lib64/$l"* "$1$cuda_home/lib64/"; done
}
label="libs ${cuda_libs[*]} from $cuda_home"
if [ "$(stand_in_label "$runtime" 2>/dev/null)" != "$label" ]; then
  t0=$(now)
  echo "[cuda-image] making $runtime (Debian 12 + ${cuda_libs[*]})"
  stand_in "$runtime" "$label" copy_libs "${nv_env[@]}"
  timings+="runtime base $(($(now) - t0)) s, "
fi

# ---- the image ----------------------------------------------------------------------------
t0=$(now)
if build "$state/build.log" -t "$image"; then
  ok "image built in $(($(now) - t0)) s after the build stage ($(mb "$image"); bases: devel $(mb \
    "docker.io/$devel"), runtime $(mb "docker.io/$runtime"))"
  timings+="image $(($(now) - t0)) s, "
else
  tail -40 "$state/build.log"
  die "podman build (log: $state/build.log)"
fi

# ---- checks -------------------------------------------------------------------------------
t0=$(now)
read -r http_port grpc_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
# Only the ports and the device are given: host 0.0.0.0 and --model /models/model are the
# image's defaults.
podman run -d --name "$name" --network=host -v "$model:/models/model:ro" "$image" \
  --device cpu --port "$http_port" --grpc-port "$grpc_port" --kv-cache-mb 64 \
  >/dev/null 2>"$state/run.err"  # (podman warns: no systemd for health timers)

healthy=""
for _ in $(seq 1 120); do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/health")" = 200 ]; then
    healthy=1
    break
  fi
  [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] || break
  sleep 0.5
done
if [ -n "$healthy" ]; then ok "/health 200 (--device cpu)"; else
  podman logs "$name" 2>&1 | tail -20
  die "/health never answered 200"
fi

body='{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}'
text=$(curl -s "http://127.0.0.1:$http_port/v1/completions" -d "$body" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])' || true)
if [[ $text == ", there was a little girl named Lily."* ]]; then ok "completion: $text"; else
  fail "completion: '$text'"
fi

if podman healthcheck run "$name" >/dev/null 2>&1; then ok "HEALTHCHECK healthy"; else
  fail "HEALTHCHECK (podman healthcheck run $name)"
fi
uid=$(podman exec "$name" id -u 2>/dev/null || echo "?")
[ "$uid" = 10001 ] && ok "runs as uid 10001" || fail "runs as uid $uid"
podman rm -f -t 10 "$name" >/dev/null 2>&1 && ok "container removed" || fail "podman rm"

help=$(podman run --rm --network=host --entrypoint llm "$image" serve --help 2>&1 || true)
if grep -q -- '--device' <<<"$help"; then
  ok "llm serve --help: $(grep -- '--device' <<<"$help" | head -1 | sed 's/^ *//; s/  */ /g')"
else
  fail "llm serve --help shows no --device"
fi

libs=$(podman run --rm --network=host --entrypoint ldd "$image" /usr/local/bin/llm 2>&1 || true)
if grep -q 'libcudart\.so' <<<"$libs" && ! grep -q 'not found' <<<"$libs"; then
  from_base=$(awk '$3 ~ "^/usr/local/cuda" {printf "%s%s", s, $1; s = ", "}' <<<"$libs")
  ok "llm loads $from_base from the base"
else
  fail "ldd llm in the image: $(grep -E 'cuda|not found' <<<"$libs" | tr '\n' ' ')"
fi

# --device cuda with no GPU (and no driver): llm must exit with its own error, not crash, and
# the error must come from the CUDA backend (not "this build has no CUDA backend").
set +e
out=$(timeout 120 podman run --rm --name "$name-cuda" --network=host \
  -v "$model:/models/model:ro" "$image" --device cuda --port "$http_port" \
  --grpc-port "$grpc_port" 2>&1)
rc=$?
set -e
err=$(grep -m1 '^error:' <<<"$out" || true)
if [ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] && [[ $err == "error: --device cuda: "* ]] \
   && [[ $err != *"no CUDA backend"* ]]; then
  ok "--device cuda without a GPU: exit $rc, '$err'"
else
  fail "--device cuda without a GPU: exit $rc, $(tail -3 <<<"$out" | tr '\n' ' ')"
fi
timings+="checks $(($(now) - t0)) s,"

# Images of earlier runs that nothing refers to any more (the current layers stay cached).
podman image prune -f >/dev/null 2>&1 || true
echo "[cuda-image] state: $(du -sxh "$state" | cut -f1) in $state (delete it to start from nothing)"
summary
[ "$failed" -eq 0 ]
