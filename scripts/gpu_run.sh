#!/usr/bin/env bash
# One call on the GPU machine (../shared/DEVICE.md): unpack the carried Debian packages into
# /opt/deps, build, run the GPU tests (ctest -L gpu) and whatever the arguments name.
#   OUT=/some/dir scripts/gpu_run.sh [ninja targets...]
# Needs: .debs/ (apt-get download ... ; see DEVICE.md) and .shared/ (a copy of ../shared's
# models, since ../shared does not travel), both git-ignored and carried; a fresh checkout makes
# them with scripts/gpu_prepare.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /opt/deps
for f in .debs/*.deb; do dpkg -x "$f" /opt/deps; done
for f in .debs/*.tar.xz; do [ -f "$f" ] && tar -C /opt/deps -xJf "$f"; done  # Beast/Asio headers
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/opt/deps/usr/share/pkgconfig
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  cmake --version | head -1; nvcc --version | tail -1
} 2>&1 | tee "$OUT/env.txt"
# NCCL (tensor parallelism): the CUDA toolkit's, else the one in PyTorch's nvidia-nccl wheel.
nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
echo "NCCL wheel: ${nccl_root:-none}; toolkit: $(ls /usr/local/cuda/lib*/libnccl.so* 2>/dev/null | head -1)" \
  >> "$OUT/env.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/opt/deps/usr \
  -DProtobuf_PROTOC_EXECUTABLE=/opt/deps/usr/bin/protoc -DLLM_SHARED_DIR="$shared" \
  -DLLM_NCCL_ROOT="$nccl_root" \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
# A missing package makes CMake skip the server or the CUDA backend quietly: fail loudly.
if grep -E 'SERVER SKIPPED|nvcc not found|CUDA disabled|llm download. is skipped' "$OUT/configure.log"; then
  echo "gpu_run: configure skipped part of the build (above; $OUT/configure.log)" >&2
  exit 1
fi
cmake --build build -- "$@" > "$OUT/build.log" 2>&1 || { grep -E 'error|FAILED' -A5 "$OUT/build.log" | head -60; exit 1; }
# GPU_TEST_REGEX narrows the GPU tests (ctest -R); GPU_POST runs afterwards (e.g. a bench).
(cd build && ctest -L gpu -R "${GPU_TEST_REGEX:-.}" --output-on-failure --timeout 300) 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -40
if [ -n "${GPU_POST:-}" ]; then
  bash -c "$GPU_POST" 2>&1 | tee "$OUT/post.log" | tail -60
fi
