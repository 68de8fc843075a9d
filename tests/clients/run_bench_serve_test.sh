#!/usr/bin/env bash
# ctest: `llm bench-serve` against a running `llm serve` (stories260K): every request succeeds
# and the JSON report has the latency percentiles.
# Usage: run_bench_serve_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$2
log=$(mktemp)
out=$(mktemp)
"$build/llm" serve --model "$shared/models/stories260K" --port 0 --grpc-port -1 \
  --kv-cache-mb 64 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$log" "$out"' EXIT
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && break
  sleep 0.05
done
[ -n "$port" ] || { cat "$log"; exit 1; }
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
