#!/usr/bin/env bash
# ctest: installs the official `openai` npm package (pinned) into the build folder, starts
# `llm serve` on stories260K with a chat template (Zephyr's), runs openai_sdk_test.mjs.
# Usage: run_openai_sdk_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$2
here=$(cd "$(dirname "$0")" && pwd)
npm_dir=$build/npm-openai
if [ ! -d "$npm_dir/node_modules/openai" ]; then
  mkdir -p "$npm_dir"
  (cd "$npm_dir" && npm install --silent --no-audit --no-fund openai@5.23.2 >/dev/null)
fi
model=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$model"' EXIT
cp "$shared"/models/stories260K/{config.json,generation_config.json,model.safetensors,tokenizer.model} "$model"/
python3 - "$shared/models/stories260K/tokenizer_config.json" "$here/../data/chat_templates/zephyr-7b-beta.jinja" "$model/tokenizer_config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["chat_template"] = open(sys.argv[2]).read()
json.dump(config, open(sys.argv[3], "w"))
PY
mv "$model" "$model.d" && mkdir -p "$model" && mv "$model.d" "$model/chatmodel"
log=$model/serve.log
"$build/llm" serve --model "$model/chatmodel" --port 0 --grpc-port -1 --api-key test-key \
  --kv-cache-mb 64 2>"$log" &
server=$!
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && break
  sleep 0.05
done
[ -n "$port" ] || { cat "$log"; exit 1; }
cp "$here/openai_sdk_test.mjs" "$npm_dir/"
LLM_BASE_URL="http://127.0.0.1:$port/v1" node "$npm_dir/openai_sdk_test.mjs"
