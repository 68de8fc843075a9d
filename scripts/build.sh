#!/usr/bin/env bash
# Configures and builds into build/ (targets given as arguments; default: everything).
# CUDA targets build when nvcc is found (also /usr/local/cuda/bin/nvcc off the PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${LLM_CMAKE_ARGS:-}
fi
if [ $# -gt 0 ]; then
  cmake --build build -- "$@"
else
  cmake --build build
fi
