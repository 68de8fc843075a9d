#!/usr/bin/env bash
# Where v4's time goes (issue #5): on the GPU machine after a build (scripts/gpu_run.sh with
# bench_prefill_attention_gpu), time v4 at hd128 causal over block sizes, then profile one
# 8k launch with Nsight Compute (full set; details, raw metrics and SASS stall sources as text).
#   OUT=... bash scripts/gpu_prefill_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=build/bench_prefill_attention_gpu
for bs in ${PROFILE_BLOCK_SIZES:-16 32 64 128}; do
  timeout 120 $B --shapes 128:8192,128:16384,64:8192 --variants v4 --no-ablations --block-size "$bs" \
    2>&1 | grep -E "^JSON|FAILED" | tee -a "$OUT/prefill_block_sizes.jsonl"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "no ncu"; exit 0; fi
timeout 300 "$NCU" --kernel-name regex:PrefillWgmma --launch-skip 1 --launch-count 1 --set full \
  --import-source no -o "$OUT/v4_8k" -f \
  $B --shapes 128:8192 --variants v4 --no-ablations --reps 1 > "$OUT/ncu_run.log" 2>&1
tail -5 "$OUT/ncu_run.log"
"$NCU" --import "$OUT/v4_8k.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
"$NCU" --import "$OUT/v4_8k.ncu-rep" --page raw > "$OUT/ncu_raw.txt" 2>&1
"$NCU" --import "$OUT/v4_8k.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_sass.csv" 2>&1
grep -E "Duration|Throughput|Pipe|Issue|Stall|Warp Cycles|Eligible|Registers|Shared" "$OUT/ncu_details.txt" | head -60
