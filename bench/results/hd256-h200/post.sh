#!/usr/bin/env bash
# After the tests (run.sh): resource usage of the decode / v3 kernels, then the benches.
set -uo pipefail
B=build
for bin in bench_decode_attention_gpu bench_prefill_attention_gpu; do
  cuobjdump -res-usage "$B/$bin" 2>&1 | grep -A1 -E 'Function .*(DecodeKernel|PrefillMmaKernel)' |
    grep -v '^--' | paste - - | sed -E 's/_ZN3llm4cuda[0-9A-Za-z_]*(DecodeKernel|PrefillMmaKernel)I/\1</'
done > "$OUT/res_usage.txt"
cat "$OUT/res_usage.txt"
# Decode: Gemma-3-12B's attention shape (16 query heads, 8 KV heads, head_dim 256), bf16 cache,
# full context and with its 1024-key window; then the same shapes at head_dim 128.
# head_dim 256 with bf16 and e4m3 caches; 128 with bf16.
D="--heads 16 --kv-heads 8 --window 1024 --shapes 64x8192,1x32768,64x32768"
{
  $B/bench_decode_attention_gpu $D --head-dim 256 --kv both
  $B/bench_decode_attention_gpu $D --head-dim 128 --kv bf16
} > "$OUT/bench_decode.txt" 2>&1
grep -v '^JSON' "$OUT/bench_decode.txt"
# Prefill: causal, 16 heads, 16k tokens, at 4k and 16k, head_dim 256 beside 128 (PREFILL=0:
# skipped).
[ "${PREFILL:-1}" = 0 ] && exit 0
$B/bench_prefill_attention_gpu --shapes 128:4096,128:16384,256:4096,256:16384 --variants v3,v4 \
  --no-ablations > "$OUT/bench_prefill.txt" 2>&1
grep -v '^JSON' "$OUT/bench_prefill.txt"
