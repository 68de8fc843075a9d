#!/usr/bin/env bash
# ctest: installs the llm_client package (clients/python; its stubs generated from
# proto/llm.proto by protoc + grpc_python_plugin at build time) into a fresh venv over
# Debian's python3-grpcio, starts `llm serve` on stories260K (with a chat template), runs
# grpc_client_test.py and examples/grpc_stream.py over gRPC, then examples/curl.sh over HTTP.
# Usage: run_grpc_client_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/common.sh"
work=$(mktemp -d)
log=$work/serve.log
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$work"' EXIT
# pip builds in the source folder: build a copy (clients/python + proto/), not the checkout.
mkdir -p "$work/src/clients" "$work/src/proto"
cp -r "$repo/clients/python" "$work/src/clients/"
cp "$repo/proto/llm.proto" "$work/src/proto/"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-build-isolation --no-index --no-deps \
  "$work/src/clients/python"
make_chat_model "$shared" "$work"  # stories260K with a chat template, for the chat example
start_server "$build" "$log" --model "$work/chatmodel" --grpc-port 0 --kv-cache-mb 64
(cd "$work" && "$work/venv/bin/python" "$here/grpc_client_test.py" "127.0.0.1:$GRPC_PORT")
streamed=$(cd "$work" && "$work/venv/bin/python" "$repo/examples/grpc_stream.py" \
  "127.0.0.1:$GRPC_PORT" "Once upon a time" 2>"$work/example.err")
[[ "$streamed" == ", there was a little girl named Lily."* ]] ||
  { cat "$work/example.err"; echo "FAIL examples/grpc_stream.py: $streamed"; exit 1; }
grep -q "health: SERVING" "$work/example.err" && grep -q "finish_reason=length" "$work/example.err" ||
  { cat "$work/example.err"; echo "FAIL examples/grpc_stream.py: stderr"; exit 1; }
echo "ok examples/grpc_stream.py"
if command -v curl >/dev/null; then
  out=$("$repo/examples/curl.sh" "http://127.0.0.1:$HTTP_PORT")
  for want in '"status"' '"object":"list"' '"text":", there was a little girl' 'data: [DONE]' \
    '"role":"assistant"' '"tokens":[1,403,407,261,378]' 'vllm:'; do
    grep -qF "$want" <<<"$out" || { echo "$out"; echo "FAIL examples/curl.sh: no $want"; exit 1; }
  done
  echo "ok examples/curl.sh"
else
  echo "skip examples/curl.sh: curl is not installed"
fi
