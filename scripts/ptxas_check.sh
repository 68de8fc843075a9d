#!/usr/bin/env bash
# Compiles CUDA sources for sm_90a with ptxas's report and fails where any kernel spills or
# where ptxas reports a performance loss of its own (C75xx: wgmma serialized for want of
# registers, C7511; fences it injected, C7519; serialized for a non-wgmma definition of an
# accumulator, C7515; ...). Needs nvcc, no GPU.
#   scripts/ptxas_check.sh kernels/cuda/attention/prefill_attention_v4_wgmma.cu [more.cu ...]
# (2026-12-07: a prefill change was checked for C7519 / C7515 only and measured 12-18% slower;
# ptxas had said C7511 for 14 of its instantiations.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "ptxas_check: no nvcc" >&2; exit 2; }
status=0
for src in "$@"; do
  log=$(mktemp)
  # -x cu: the file compiles as CUDA whatever its name; the include root is the repository.
  "$NVCC" -DLLM_HAS_CUDA=1 -I. -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
    -cubin -Xptxas -v -x cu "$src" -o /dev/null > "$log" 2>&1
  rc=$?
  losses=$(grep -c 'C75[0-9][0-9]' "$log")
  spills=$(grep -cE '[1-9][0-9]* bytes spill (stores|loads)' "$log")
  kernels=$(grep -c 'Compiling entry function' "$log")
  echo "$src: $kernels kernels, ptxas performance notes (C75xx) $losses, spilling $spills, rc $rc"
  if [ $rc -ne 0 ] || [ "$losses" -gt 0 ] || [ "$spills" -gt 0 ]; then
    grep -E 'error|C75[0-9][0-9]|[1-9][0-9]* bytes spill' "$log" | head -20
    status=1
  fi
  rm -f "$log"
done
exit $status
