#!/usr/bin/env bash
# Greedy tokens of fixed CUDA runs, for comparing two builds bit for bit (a refactor must not
# change them). On the GPU machine, after a build (scripts/gpu_run.sh), from the repo root:
#   OUT=/some/dir bash scripts/gpu_tokens.sh
# writes $OUT/tokens/*.txt (logs in $OUT/tokens.log, bench lines in $OUT/tokens_bench.jsonl): `llm generate --device cuda` on stories260K and the tiny random
# models, and `llm bench --output-ids` of the e2e latency run (Llama-2-7B shape, batch 1, 256
# tokens) with bf16 and fp8 weights and of a 64-request greedy batch (Llama-3-8B shape,
# prompts of 16-512 tokens, so prefill chunks, mixed steps and graphs all run). Compare two
# builds' archives (tokens.tar.gz) or the md5 sums printed per run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
T=$OUT/tokens
mkdir -p "$T"
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
tok=$shared/models/stories260K
gen() {  # gen NAME MODEL_DIR ARGS...
  local name=$1 model=$2
  shift 2
  timeout 120 build/llm generate --device cuda --model "$model" --prompt "Once upon a time" \
    --temperature 0 --max-tokens 64 "$@" > "$T/generate_$name.txt" 2>> "$OUT/tokens.log"
  echo "generate $name: exit $? $(md5sum < "$T/generate_$name.txt" | cut -c1-12) $(head -c 80 "$T/generate_$name.txt" | tr -cd '[:print:]')"
}
bench() {  # bench NAME ARGS...
  local name=$1
  shift
  timeout 240 build/llm bench --device cuda --load-format dummy --tokenizer "$tok" \
    --temperature 0 --output-ids "$T/bench_$name.txt" "$@" >> "$OUT/tokens_bench.jsonl" \
    2>> "$OUT/tokens.log"
  echo "bench $name: exit $? $(wc -l < "$T/bench_$name.txt" 2>/dev/null) lines, $(md5sum < "$T/bench_$name.txt" | cut -c1-12)"
}
gen stories260K "$tok"
gen stories260K_f16 "$tok" --dtype f16
tiny=/tmp/tiny_models
mkdir -p $tiny
for m in hd128 hd64; do
  build/llm make-model --config tests/data/tiny_models/$m.json --out $tiny/$m --seed 7 \
    --dtype f32 --tokenizer "$tok/tokenizer.model" > /dev/null
  gen $m $tiny/$m
  gen ${m}_fp8 $tiny/$m --quantization fp8
done
C7=engine/configs/llama-2-7b.json
C8=engine/configs/llama-3-8b.json
bench latency_7b_b1 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --warmup --max-num-seqs 256
bench latency_7b_b1_w8 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --warmup --max-num-seqs 256 --quantization fp8
bench batch_8b_64 --model $C8 --num-requests 64 --min-input 16 --max-input 512 \
  --min-output 32 --max-output 96 --max-num-seqs 64 --max-num-batched-tokens 2048
bench batch_8b_64_fp8kv --model $C8 --num-requests 64 --min-input 16 --max-input 512 \
  --min-output 32 --max-output 96 --max-num-seqs 64 --max-num-batched-tokens 2048 \
  --kv-cache-dtype fp8
# One archive (the device call returns only a few files).
tar -czf "$OUT/tokens.tar.gz" -C "$OUT" tokens && rm -rf "$T"
