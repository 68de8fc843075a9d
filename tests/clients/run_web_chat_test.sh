#!/usr/bin/env bash
# ctest web_chat: the chat page served by `llm serve` (the demo model, given a chat template),
# driven by Debian's headless Chromium through playwright-core (npm, pinned, installed into
# the build folder): web_chat_test.mjs. The screenshot lands in BUILD_DIR/test-artifacts/.
# Exits 77 (ctest: skipped) when there is no Chromium (`apt-get install chromium`;
# scripts/deps.sh installs it for the tests).
# Usage: run_web_chat_test.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
chromium=${LLM_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
  echo "SKIP: no Chromium at $chromium (apt-get install chromium, or set LLM_CHROMIUM)"
  exit 77
fi
npm_dir=$build/npm-playwright
if [ ! -d "$npm_dir/node_modules/playwright-core" ]; then
  mkdir -p "$npm_dir"
  # playwright-core drives a browser it is given and downloads none.
  (cd "$npm_dir" && npm install --silent --no-audit --no-fund playwright-core@1.65.1 >/dev/null)
fi
tmp=$(mktemp -d)
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$tmp"' EXIT
# The demo model as built (scripts/make_demo_model.sh gives it Zephyr's chat template): what
# `scripts/serve.sh` serves, so the page works out of the box.
grep -q chat_template "$build/models/demo/tokenizer_config.json" \
  || { echo "the demo model has no chat template"; exit 1; }
# (The log exists before start_server reads it: its first sed must not race the redirect.)
: >"$tmp/serve.log"
# One model thread: the server must not take every core from Chromium, or on a 2-core machine
# the page's Stop click lands only after a 2,000-token reply has finished (seen in CI: the
# reply took 2.75 s and the click came later).
start_server "$build" "$tmp/serve.log" --model "$build/models/demo" --grpc-port -1 --api-key web-key \
  --kv-cache-mb 64 --threads 1
mkdir -p "$build/test-artifacts"
cp "$here/web_chat_test.mjs" "$npm_dir/"
LLM_URL="http://127.0.0.1:$HTTP_PORT" LLM_API_KEY=web-key LLM_CHROMIUM="$chromium" \
  LLM_SCREENSHOT="$build/test-artifacts/web_chat.png" node "$npm_dir/web_chat_test.mjs" \
  || { echo "--- server log"; tail -n 30 "$tmp/serve.log"; exit 1; }
