#!/usr/bin/env bash
# ctest server_soak: starts `llm serve` on stories260K (with a chat template: Zephyr's) with
# small limits, runs server_soak.py against it, then SIGTERMs the server and checks it exits 0.
# Usage: run_server_soak.sh BUILD_DIR SHARED_DIR [--full] [extra server_soak.py flags]
#   default (CI): 1,500 requests, 24 clients, <= 60 s; --full: 10,000 requests, 64 clients, <= 300 s.
set -euo pipefail
build=$(cd "$1" && pwd)
shared=$2
shift 2
size=(--requests 1500 --clients 24 --seconds 60)
if [ "${1:-}" = "--full" ]; then
  size=(--requests 10000 --clients 64 --seconds 300)
  shift
fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill -9 $server 2>/dev/null; rm -rf "$work"' EXIT
model=$work/stories260K-chat
mkdir -p "$model"
cp "$shared"/models/stories260K/{config.json,generation_config.json,model.safetensors,tokenizer.model} "$model"/
/usr/bin/python3 - "$shared/models/stories260K/tokenizer_config.json" \
  "$here/../data/chat_templates/zephyr-7b-beta.jinja" "$model/tokenizer_config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["chat_template"] = open(sys.argv[2]).read()
json.dump(config, open(sys.argv[3], "w"))
PY
log=$work/serve.log
: >"$log"  # before the server opens it: the sed below must never find no file (set -e)
max_body=65536
"$build/llm" serve --model "$model" --port 0 --grpc-port -1 --threads 1 \
  --max-queued-requests 8 --max-body-bytes $max_body --kv-cache-mb 16 --max-num-seqs 16 \
  2>"$log" &
server=$!
port=
for _ in $(seq 1 400); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && break
  kill -0 $server 2>/dev/null || break
  sleep 0.05
done
[ -n "$port" ] || { echo "server did not start:"; cat "$log"; exit 1; }
rc=0
/usr/bin/python3 "$here/server_soak.py" --url "http://127.0.0.1:$port" --pid $server \
  --max-body-bytes $max_body --admission-limit 24 --json "${SOAK_JSON:-$build/server_soak.json}" "${size[@]}" "$@" || rc=$?
# Graceful shutdown: SIGTERM drains and must exit 0 (within the drain timeout + margin).
kill -TERM $server
status=0
for _ in $(seq 1 600); do
  kill -0 $server 2>/dev/null || break
  sleep 0.05
done
if kill -0 $server 2>/dev/null; then
  echo "FAIL: the server did not exit within 30 s of SIGTERM"; rc=1
else
  wait $server || status=$?
  if [ $status -ne 0 ]; then echo "FAIL: the server exited $status after SIGTERM"; rc=1; fi
fi
server=
if grep -q -i "terminate called\|Sanitizer\|Segmentation" "$log"; then
  echo "FAIL: the server log shows a crash:"; grep -i "terminate called\|Sanitizer\|Segmentation" "$log" | head; rc=1
fi
[ $rc -eq 0 ] && echo "server_soak: OK (server exited 0 after SIGTERM)"
exit $rc
