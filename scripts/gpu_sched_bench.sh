#!/usr/bin/env bash
# Issue 29, target 4 (the scheduler never loses to its own limit), on the GPU machine, from the
# repo root with OUT set; carry .debs and .shared (../shared/DEVICE.md). One device call:
# builds `llm` and the GPU tests the scheduler touches (scripts/gpu_run.sh), then runs
# `llm bench --device cuda --load-format dummy` on the Llama-3-8B shape, bf16 weights + bf16
# KV, SCHED_REQUESTS x (1,000 prompt + 1,000 output tokens, ignore_eos), at --max-num-seqs
# 128 / 256 / 512 / 1,024 with admission's KV headroom (the default) and without it
# (--kv-reserve-ratio 0, the behaviour before), and prints throughput and preemptions per
# 1,000 requests. Results: $OUT/sched-runs.jsonl, $OUT/sched-summary.txt.
# --gpu-memory-utilization SCHED_GPU_UTIL (default 0.5) leaves a KV pool of ~420k tokens, about
# 210 whole sequences: the pool, not max_num_seqs, bounds the batch, as with 1,000 requests
# in a full pool, in a fraction of the time.
#   SCHED_REQUESTS (default 400)  SCHED_RUNS "name ..." (default: all)  SCHED_SEQS (default
#   "256 512 128 1024")  SCHED_SKIP_BUILD=1 (a warm machine: build/ is there)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared

if [ -z "${SCHED_SKIP_BUILD:-}" ]; then
  GPU_TEST_REGEX=${GPU_TEST_REGEX:-'^(cuda_grammar_gpu_test|engine_gpu_test)'} OUT=$OUT \
    bash scripts/gpu_run.sh llm cuda_grammar_gpu_test engine_gpu_test 2>&1 | tail -15
fi
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
[ -x build/llm ] || { echo "gpu_sched_bench: no build/llm" >&2; exit 1; }

source scripts/bench_run.sh
BENCH_RESULTS=$OUT/sched-runs.jsonl BENCH_LOG=$OUT/sched.log BENCH_SELECT=${SCHED_RUNS:-}
BENCH_TOKENIZER=$shared/models/stories260K
: >> "$BENCH_RESULTS"
n=${SCHED_REQUESTS:-400}
for seqs in ${SCHED_SEQS:-256 512 128 1024}; do
  for policy in reserve greedy; do
    extra=()
    [ "$policy" = greedy ] && extra=(--kv-reserve-ratio 0)
    bench_run "throughput_8b_${seqs}seq_$policy" 300 --model engine/configs/llama-3-8b.json \
      --num-requests "$n" --min-input 1000 --max-input 1000 --min-output 1000 \
      --max-output 1000 --max-num-seqs "$seqs" --max-num-batched-tokens 8192 \
      --temperature 1.0 --gpu-memory-utilization "${SCHED_GPU_UTIL:-0.5}" "${extra[@]}"
  done
done
python3 - "$BENCH_RESULTS" <<'PY' | tee "$OUT/sched-summary.txt"
import json, sys
print(f"{'run':34} {'out tok/s':>10} {'preempt':>8} {'per 1k req':>10} {'kv tokens':>10}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "error" in r:
        print(f"{r['name']:34} {r['error']}")
        continue
    d = r["result"]
    print(f"{r['name']:34} {d['generated_tokens_per_s']:>10.0f} {d['preemptions']:>8} "
          f"{d.get('preemptions_per_1k_requests', 0):>10.1f} {d.get('kv_cache_tokens', 0):>10}")
PY
