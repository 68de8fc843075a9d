#!/usr/bin/env bash
# The serving path on the GPU machine, in one go (issue 26): the offline `llm bench` of a
# workload, then `llm serve --device cuda` with `llm bench-serve` of the same workload at
# concurrency 128, 512 and 1,024 against --max-num-seqs 512, each run probing /health (latency
# on a new connection) and sampling the running-requests gauge. Mistral-7B-v0.2 shape (the
# Mistral tokenizer in ../shared covers every id), dummy bf16 weights, HTTP on loopback.
#   OUT=... bash scripts/gpu_serve_bench.sh      (after a build: build/llm)
# Writes $OUT/serve-offline.json, $OUT/serve-c<C>.json, $OUT/serve.log and a table last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
[ -x build/llm ] && build/llm serve --help > /dev/null 2>&1 ||
  { echo "gpu_serve_bench: build/llm has no serve command (configure skipped the server)" >&2; exit 1; }
MODEL=engine/configs/mistral-7b-v0.2.json
TOK=$shared/models/tokenizers/mistral-7b-v0.1
N=${SERVE_PROMPTS:-1536}
IN=${SERVE_INPUT:-512}
OUTLEN=${SERVE_OUTPUT:-256}
SEQS=512
BATCHED=8192
PORT=8123
build/llm bench --device cuda --load-format dummy --model $MODEL --tokenizer "$TOK" \
  --num-requests "$N" --min-input "$IN" --max-input "$IN" --min-output "$OUTLEN" \
  --max-output "$OUTLEN" --max-num-seqs $SEQS --max-num-batched-tokens $BATCHED --temperature 1 \
  --warmup 2> "$OUT/serve-offline.log" | tail -1 > "$OUT/serve-offline.json"
cat "$OUT/serve-offline.json"
# 1,024 clients: 512 run, up to 512 more wait in the admission queue (none gets a 429).
build/llm serve --device cuda --load-format dummy --model $MODEL --tokenizer "$TOK" --port $PORT \
  --grpc-port -1 --max-num-seqs $SEQS --max-num-batched-tokens $BATCHED \
  --max-queued-requests 1024 > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do
  curl -sf http://127.0.0.1:$PORT/health > /dev/null 2>&1 && break
  sleep 0.5
done
# Warm-up (CUDA graphs, allocator) before the measured runs.
build/llm bench-serve --url http://127.0.0.1:$PORT --num-prompts 64 --input-len "$IN" \
  --output-len 16 --max-concurrency 64 --probe-interval 0 > /dev/null 2>&1
for c in ${SERVE_CONCURRENCY:-128 512 1024}; do
  timeout 400 build/llm bench-serve --url http://127.0.0.1:$PORT --num-prompts "$N" \
    --input-len "$IN" --output-len "$OUTLEN" --request-rate inf --max-concurrency "$c" \
    --probe-interval 0.1 --seed 1 --json-out "$OUT/serve-c$c.json" 2>&1 | grep -v '^JSON' | tail -12
done
kill -TERM $pid
wait $pid
grep -v '^\[llm\] {' "$OUT/serve.log" | tail -5
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
offline = json.load(open(os.path.join(out, "serve-offline.json")))
base = offline["generated_tokens_per_s"]
print(f"offline llm bench: {base:.0f} output tok/s, {offline['preemptions']} preemptions")
print("| concurrency | output tok/s | / offline | TTFT mean | running max | /health p50 | p99 | max | failed | errors |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in os.environ.get("SERVE_CONCURRENCY", "128 512 1024").split():
    p = os.path.join(out, f"serve-c{c}.json")
    if not os.path.exists(p):
        print(f"| {c} | (no result) |"); continue
    r = json.load(open(p))
    h = r["health_latency_s"]
    print(f"| {c} | {r['output_token_throughput']:.0f} | {r['output_token_throughput']/base:.3f} | "
          f"{r['ttft_s']['mean']:.2f} s | {r['requests_running_max']:.0f} | {h['p50']*1e3:.1f} ms | "
          f"{h['p99']*1e3:.1f} ms | {r['health_latency_max_s']*1e3:.1f} ms | {r['health_failures']} | "
          f"{r['num_prompts'] - r['successful_requests']} |")
PY
