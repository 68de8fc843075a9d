#!/usr/bin/env bash
# Today's architectures on the H200 (issue 27), from the repo root with OUT set, after
# scripts/gpu_run.sh built `llm` (carry .debs and .shared; ../shared/DEVICE.md). Dummy weights
# at real shapes (engine/configs): the copy-bandwidth ceiling, then per model batch-1 decode
# (128 + 256 tokens; bench/e2e_report.py puts it against the weight roofline at the run's copy
# bandwidth) and offline throughput, ARCH_REQUESTS x (1,000 prompt + 1,000 output), ignore_eos,
# 256 sequences, bf16 weights and KV. bench/e2e_report.py -> $OUT/arch-h200.json + arch-summary.md.
#   ARCH_MODELS="qwen2.5-7b qwen3-8b"   the configs to run (engine/configs/<name>.json)
#   ARCH_TIMEOUT=300   seconds per throughput run (Gemma-3-12B's 1,000 requests take ~5 min)
#   ARCH_FP8=1   the same two runs with --quantization fp8 (W8A8), throughput also with the fp8
#                KV cache at 512 sequences (the *_w8 runs)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
RESULTS=$OUT/arch-runs.jsonl
: > "$RESULTS"
source scripts/bench_run.sh
BENCH_RESULTS=$RESULTS BENCH_LOG=$OUT/arch.log BENCH_SELECT=${ARCH_RUNS:-}
BENCH_TOKENIZER=$shared/models/stories260K
timeout 60 build/bench_copy_bandwidth_gpu > "$OUT/ceilings.txt" 2>&1
cat "$OUT/ceilings.txt"
for m in ${ARCH_MODELS:-qwen2.5-7b qwen3-8b}; do
  cfg=engine/configs/$m.json
  tag=${m//[.-]/_}
  bench_run "latency_${tag}_b1" 150 --model "$cfg" --num-requests 1 --min-input 128 \
    --max-input 128 --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256
  bench_run "throughput_${tag}" "${ARCH_TIMEOUT:-300}" --model "$cfg" --num-requests "${ARCH_REQUESTS:-1000}" \
    --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 256 \
    --max-num-batched-tokens 8192 --temperature 1.0
  if [ "${ARCH_FP8:-0}" = 1 ]; then
    bench_run "latency_${tag}_b1_w8" 150 --model "$cfg" --num-requests 1 --min-input 128 \
      --max-input 128 --min-output 256 --max-output 256 --temperature 0 --warmup \
      --max-num-seqs 256 --quantization fp8
    bench_run "throughput_${tag}_w8_fp8kv_512seq" "${ARCH_TIMEOUT:-300}" --model "$cfg" \
      --num-requests "${ARCH_REQUESTS:-1000}" --min-input 1000 --max-input 1000 --min-output 1000 \
      --max-output 1000 --max-num-seqs 512 --max-num-batched-tokens 8192 --temperature 1.0 \
      --quantization fp8 --kv-cache-dtype fp8
  fi
done
python3 bench/e2e_report.py --runs "$RESULTS" --ceilings "$OUT/ceilings.txt" \
  --json "$OUT/arch-h200.json" --md "$OUT/arch-summary.md"
cat "$OUT/arch-summary.md"
