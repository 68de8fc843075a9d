#!/usr/bin/env bash
# ctest: generates Python stubs from proto/llm.proto (protoc + grpc_python_plugin from
# Debian), starts `llm serve` on stories260K, runs grpc_client_test.py with /usr/bin/python3.
# Usage: run_grpc_client_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
stubs=$build/python-stubs
mkdir -p "$stubs"
protoc --proto_path="$here/../../proto" --python_out="$stubs" --grpc_out="$stubs" \
  --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" llm.proto
log=$(mktemp)
trap 'kill $SERVER_PID 2>/dev/null || true; rm -f "$log"' EXIT
start_server "$build" "$log" --model "$shared/models/stories260K" --grpc-port 0 --kv-cache-mb 64
/usr/bin/python3 "$here/grpc_client_test.py" "127.0.0.1:$GRPC_PORT" "$stubs"
