#!/usr/bin/env bash
# ctest: `llm bench-serve` against a running `llm serve` (stories260K): every request succeeds
# and the JSON report has the latency percentiles; then bench/plot_bench_serve.py sweeps two
# request rates and plots latency against load (the PNG lands in BUILD_DIR/test-artifacts/).
# Usage: run_bench_serve_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
log=$(mktemp)
out=$(mktemp)
sweep=$(mktemp -d)
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$log" "$out" "$sweep"' EXIT
start_server "$build" "$log" --model "$shared/models/stories260K" --grpc-port -1 --kv-cache-mb 64
port=$HTTP_PORT
"$build/llm" bench-serve --url "http://127.0.0.1:$port" --num-prompts 16 --input-len 32 \
  --output-len 16 --request-rate 50 --max-concurrency 8 --json-out "$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["successful_requests"] == 16, r
assert r["total_output_tokens"] == 16 * 16, r
for key in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
    s = r[key]
    assert 0 < s["p50"] <= s["p90"] <= s["p99"], (key, s)
print("1 passed, 0 failed")
PY
# Latency against load: a two-rate sweep (Debian's python3-matplotlib, not a pyenv python).
python=${LLM_SYSTEM_PYTHON:-/usr/bin/python3}
if ! "$python" -c "import matplotlib" 2>/dev/null; then
  echo "SKIP the plot: no matplotlib for $python (apt-get install python3-matplotlib)"
  exit 0
fi
mkdir -p "$build/test-artifacts"
png=$build/test-artifacts/bench_serve_latency.png
rm -f "$png"
"$python" "$here/../../bench/plot_bench_serve.py" --out "$png" --llm "$build/llm" \
  --sweep 25,inf --json-dir "$sweep" -- --url "http://127.0.0.1:$port" --num-prompts 16 \
  --input-len 32 --output-len 16 --max-concurrency 8
[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] \
  || { echo "not a PNG: $png"; exit 1; }
echo "ok plot $png"
