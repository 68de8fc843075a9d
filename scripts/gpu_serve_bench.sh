#!/usr/bin/env bash
# `llm bench-serve` against `llm serve --device cuda` on the GPU machine (issue #8's GPU
# serving run): Mistral-7B-v0.2 shape (Llama-3-8B's layers with a 32k vocabulary, so that the
# Mistral tokenizer in ../shared covers every id), dummy bf16 weights, over HTTP on loopback.
# Sweeps the request rate; one JSON per rate in $OUT/serve-rate-<R>.json.
#   OUT=... bash scripts/gpu_serve_bench.sh      (after a build: build/llm)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
PORT=8123
build/llm serve --device cuda --load-format dummy --model engine/configs/mistral-7b-v0.2.json \
  --tokenizer "$shared/models/tokenizers/mistral-7b-v0.1" --port $PORT --grpc-port -1 \
  --max-num-seqs 256 --max-num-batched-tokens 8192 > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
  curl -sf http://127.0.0.1:$PORT/health > /dev/null 2>&1 && break
  sleep 0.5
done
for rate in ${SERVE_RATES:-8 32 64 inf}; do
  timeout 120 build/llm bench-serve --url http://127.0.0.1:$PORT --num-prompts "${SERVE_PROMPTS:-300}" \
    --input-len 512 --output-len 256 --request-rate "$rate" --max-concurrency 256 \
    --json-out "$OUT/serve-rate-$rate.json" 2>&1 | tail -14
done
kill -TERM $pid; wait $pid
tail -3 "$OUT/serve.log"
