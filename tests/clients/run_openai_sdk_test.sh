#!/usr/bin/env bash
# ctest: installs the official `openai` npm package (pinned) into the build folder, starts
# `llm serve` on stories260K with a chat template (Zephyr's), runs openai_sdk_test.mjs, then
# drives the same server with `llm chat` (the command-line client).
# Usage: run_openai_sdk_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
npm_dir=$build/npm-openai
if [ ! -d "$npm_dir/node_modules/openai" ]; then
  mkdir -p "$npm_dir"
  (cd "$npm_dir" && npm install --silent --no-audit --no-fund openai@5.23.2 >/dev/null)
fi
tmp=$(mktemp -d)
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$tmp"' EXIT
make_chat_model "$shared" "$tmp"
start_server "$build" "$tmp/serve.log" --model "$tmp/chatmodel" --grpc-port -1 \
  --api-key test-key --kv-cache-mb 64
cp "$here/openai_sdk_test.mjs" "$npm_dir/"
LLM_BASE_URL="http://127.0.0.1:$HTTP_PORT/v1" node "$npm_dir/openai_sdk_test.mjs"
# `llm chat`: two turns with history, streamed to stdout.
reply=$(printf 'Tell me a story\nAnd then?\n' | LLM_API_KEY=test-key "$build/llm" chat \
  --url "http://127.0.0.1:$HTTP_PORT" --system "You tell stories." --max-tokens 12 \
  --temperature 0)
[ "$(printf '%s\n' "$reply" | grep -c .)" -ge 2 ] || { echo "llm chat: '$reply'"; exit 1; }
echo "ok llm chat"
