#!/usr/bin/env bash
# ctest: `llm serve` on each of ../shared/models/hf-arch's folders (tiny checkpoints
# written by transformers; stories260K's tokenizer copied in, their vocabulary is its 512)
# answers /v1/completions with transformers' greedy 32 tokens (reference.json), streamed and
# not, and the two agree token for token (hf_arch_serve_check.py).
# Usage: run_hf_arch_serve_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
work=$(mktemp -d)
SERVER_PID=
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$work"' EXIT
for name in qwen2 qwen3 mistral_sw16 llama31 phi3 gemma3 mixtral qwen3_moe; do
  src=$shared/models/hf-arch/$name
  dest=$work/$name
  mkdir -p "$dest"
  ln -s "$src"/{config.json,generation_config.json,model.safetensors} "$dest"/
  cp "$shared"/models/stories260K/{tokenizer.model,tokenizer_config.json} "$dest"/
  start_server "$build" "$work/$name.log" --model "$dest" --kv-cache-mb 16
  python3 "$here/hf_arch_serve_check.py" "127.0.0.1:$HTTP_PORT" "$src/reference.json" "$name" ||
    { cat "$work/$name.log"; exit 1; }
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
done
echo "ok hf-arch serve: 8 architectures"
