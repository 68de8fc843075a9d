#!/usr/bin/env bash
# A kernel timeline of batch-1 decode on the GPU machine (no nsys there): builds llm and the
# CUPTI injection library (bench/cupti_trace.cc), runs `llm bench` under it and prints where a
# decode step's time goes per kernel class, and the eager (prefill / mixed) steps' kernels
# summed (bench/kernel_timeline.py). From the repo root with
# OUT set; carry .debs and .shared (../shared/DEVICE.md). One call, ~2 minutes:
#   OUT=... bash scripts/gpu_trace.sh [extra llm bench flags, e.g. --quantization fp8]
# TRACE_MODEL (default engine/configs/llama-2-7b.json) picks the dummy model; TRACE_WORKLOAD
# replaces the batch-1 workload (default: 1 request of 128 + 256 tokens, greedy), e.g.
#   TRACE_WORKLOAD="--num-requests 256 --min-input 1000 --max-input 1000 --min-output 200
#     --max-output 200 --max-num-seqs 256" for the decode steps of a throughput run, with
#   TIMELINE_ARGS="--graph widest --skip 0" (bench/kernel_timeline.py: the full batch's decode
#   graph, which a throughput run replays only a few times).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
GPU_TEST_REGEX='^$' OUT=$OUT bash scripts/gpu_run.sh llm llm_cupti_trace > "$OUT/build_out.txt" 2>&1 ||
  { tail -30 "$OUT/build_out.txt"; exit 1; }
model=${TRACE_MODEL:-engine/configs/llama-2-7b.json}
name=$(basename "$model" .json)$(echo "$*" | tr -c 'a-z0-9' '_' | sed 's/_*$//')
workload=${TRACE_WORKLOAD:---num-requests 1 --min-input 128 --max-input 128 --min-output 256 \
--max-output 256 --temperature 0 --warmup --max-num-seqs 256}
run() {  # run TAG [CUDA_INJECTION64_PATH]: llm bench, its JSON line to $OUT/bench-TAG.json
  # shellcheck disable=SC2086
  CUDA_INJECTION64_PATH=${2:-} LLM_TRACE_OUT=$OUT/trace-$name.csv timeout 300 build/llm bench \
    --device cuda --load-format dummy --tokenizer "$shared/models/stories260K" --model "$model" \
    $workload "${@:3}" 2>> "$OUT/trace.log" | tail -1 > "$OUT/bench-$1.json"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], 'ms/token', d['tpot_ms_mean'])" \
    "$OUT/bench-$1.json" "$1"
}
# The same run without and with the tracer: the tracer's own cost shows in ms/token.
run "$name" "" "$@"
run "$name-traced" "$(pwd)/build/libllm_cupti_trace.so" "$@"
tail -3 "$OUT/trace.log"
# shellcheck disable=SC2086
python3 bench/kernel_timeline.py "$OUT/trace-$name.csv" --json "$OUT/timeline-$name.json" ${TIMELINE_ARGS:-} \
  | tee "$OUT/timeline-$name.txt"
gzip -f "$OUT/trace-$name.csv"
