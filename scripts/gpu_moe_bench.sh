#!/usr/bin/env bash
# Mixture of experts on the H200 (issue 30): the MoE GPU tests on every kernel set (bf16 and
# fp8 experts), bench_moe_gpu (sets MOE_BENCH_SETS, default 45: v4 and v5; bf16 and fp8), and
# `llm bench --load-format dummy` on Qwen3-30B-A3B (batch-1 decode, 128 + 256 tokens, then
# MOE_REQUESTS x (1,000 + 1,000) at 256 sequences) with each --moe-kernels set of MOE_SETS
# (default "v4 v5") and with fp8 experts on each set of MOE_FP8_KERNELS (default "v4 v5"), TTFT
# of a 4,096-token prompt on each, and Mixtral-8x7B
# batch-1 decode on the last of MOE_SETS. The batch-1 runs come first (the shortest), then the
# throughput runs: a call cut short by its time limit keeps what finished. Tensor parallelism
# needs 2 GPUs (nvidia-h200-x2):
#   build/cuda_tp_gpu_test --gtest_filter='*MixtureOfExperts*' Run after
# scripts/gpu_run.sh built the targets (carry .debs and .shared; ../shared/DEVICE.md):
#   OUT=... GPU_TEST_REGEX=NO_SUCH_TEST GPU_POST='bash scripts/gpu_moe_bench.sh' \
#     bash scripts/gpu_run.sh llm moe_gpu_test hf_arch_gpu_test cuda_executor_gpu_test \
#     bench_moe_gpu bench_copy_bandwidth_gpu
# A call brings back at most 8 files, so this leaves five in $OUT and removes gpu_run.sh's
# logs (their failing lines are copied into moe-tests.txt first):
#   moe-tests.txt      the tests' own output (gtest), with each MoE test's printed figures
#   moe-kernels.jsonl  bench_moe_gpu's lines
#   moe-e2e.jsonl      the llm bench runs ({"name", "result"} per line)
#   moe-e2e.log        llm's stderr of those runs
#   ceilings.txt       the copy bandwidth of this machine, and env.txt's lines
#   MOE_REQUESTS=200  MOE_TIMEOUT=150 (seconds per throughput run)
#   MOE_TESTS=0 skips the tests and bench_moe_gpu; MOE_RUNS="name ..." picks the llm bench runs,
#   MOE_RUNS=none runs none (a call is 600 s at most: split them across two calls on a warm
#   machine, whose build/ is kept)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
if [ "${MOE_TESTS:-1}" != 0 ]; then
{
  [ -f "$OUT/build.log" ] && grep -E 'error|FAILED' -A5 "$OUT/build.log" | head -40
  timeout 300 build/moe_gpu_test 2>&1 | grep -E '^\[ +(OK|FAILED|SKIPPED) |Failure|Expected|Which|actual|  Actual'
  timeout 600 build/hf_arch_gpu_test --gtest_filter="${MOE_ARCH_FILTER:-*mixtral*:*qwen3_moe*}" 2>&1 |
    grep -E '^\[ +(OK|FAILED|SKIPPED) |Failure|Expected|Which|actual|^  [a-z0-9_]+ (bf16|fp16)|rerouted|  Actual'
  timeout 300 build/cuda_executor_gpu_test --gtest_filter='*Dummy*:*BadInput*' 2>&1 |
    grep -E '^\[ +(OK|FAILED|SKIPPED) |Failure|Expected|Which|actual|dummy|  Actual'
} > "$OUT/moe-tests.txt" 2>&1
grep -c '^\[ *OK' "$OUT/moe-tests.txt" | sed 's/^/tests passed: /'
grep '^\[ *FAILED' "$OUT/moe-tests.txt"
timeout "${MOE_BENCH_TIMEOUT:-240}" build/bench_moe_gpu --reps 10 --kernels "${MOE_BENCH_SETS:-45}" \
  > "$OUT/moe-kernels.jsonl" 2>&1
cut -c1-220 "$OUT/moe-kernels.jsonl"
fi
{
  cat "$OUT/env.txt" 2>/dev/null
  timeout 60 build/bench_copy_bandwidth_gpu 2>&1
} > "$OUT/ceilings.txt"
[ "${MOE_RUNS:-}" = none ] && { rm -f "$OUT"/build.log "$OUT"/configure.log "$OUT"/gpu_tests.log "$OUT"/post.log "$OUT"/env.txt; exit 0; }
source scripts/bench_run.sh
BENCH_RESULTS=$OUT/moe-e2e.jsonl BENCH_LOG=$OUT/moe-e2e.log BENCH_SELECT=${MOE_RUNS:-}
BENCH_TOKENIZER=$shared/models/stories260K
: > "$BENCH_RESULTS"
sets=${MOE_SETS:-v4 v5}
fp8_sets=${MOE_FP8_KERNELS:-v4 v5}
qwen=(--model engine/configs/qwen3-30b-a3b.json --max-num-seqs 256)
b1=(--num-requests 1 --min-input 128 --max-input 128 --min-output 256 --max-output 256
  --temperature 0 --warmup)
tp=(--num-requests "${MOE_REQUESTS:-200}" --min-input 1000 --max-input 1000 --min-output 1000
  --max-output 1000 --max-num-batched-tokens 8192 --temperature 1.0)
for k in $sets; do
  bench_run "latency_qwen3_30b_a3b_b1_$k" 150 "${qwen[@]}" "${b1[@]}" --moe-kernels "$k"
done
last=${sets##* }
# The one-CTA-per-token RoPE (--no-rope-head-warps; the default, since 2026-12-06, is a warp per
# head with Qwen3's per-head norms) on the last set.
bench_run "latency_qwen3_30b_a3b_b1_${last}_rope_cta" 150 "${qwen[@]}" "${b1[@]}" \
  --moe-kernels "$last" --no-rope-head-warps
# The experts' sum added by the next RMSNorm (--moe-combine-in-norm), not by a launch of its own.
bench_run "latency_qwen3_30b_a3b_b1_${last}_combine_in_norm" 150 "${qwen[@]}" "${b1[@]}" \
  --moe-kernels "$last" --moe-combine-in-norm
# fp8 experts: weight-only GEMV in decode, W8A8 tiles in prefill.
for fk in $fp8_sets; do
  bench_run "latency_qwen3_30b_a3b_b1_fp8_$fk" 150 "${qwen[@]}" "${b1[@]}" --moe-kernels "$fk" \
    --quantization fp8
done
# Time to first token of one 4,096-token prompt (one prefill chunk: the experts' GEMMs at 32,768
# routed rows, ~256 per expert), with each set and with fp8 experts (W8A8) on MOE_FP8_KERNELS'.
ttft=(--num-requests 1 --min-input 4096 --max-input 4096 --min-output 1 --max-output 1
  --max-num-batched-tokens 8192 --temperature 0 --warmup)
for k in $sets; do
  bench_run "ttft_qwen3_30b_a3b_4096_$k" 150 "${qwen[@]}" "${ttft[@]}" --moe-kernels "$k"
done
for fk in $fp8_sets; do
  bench_run "ttft_qwen3_30b_a3b_4096_fp8_$fk" 150 "${qwen[@]}" "${ttft[@]}" --moe-kernels "$fk" \
    --quantization fp8
done
for k in $sets; do
  bench_run "throughput_qwen3_30b_a3b_$k" "${MOE_TIMEOUT:-150}" "${qwen[@]}" "${tp[@]}" \
    --moe-kernels "$k"
done
for fk in $fp8_sets; do
  bench_run "throughput_qwen3_30b_a3b_fp8_$fk" "${MOE_TIMEOUT:-150}" "${qwen[@]}" "${tp[@]}" \
    --moe-kernels "$fk" --quantization fp8
done
bench_run "latency_mixtral_8x7b_b1_$last" 200 --model engine/configs/mixtral-8x7b.json \
  "${b1[@]}" --max-num-seqs 64 --moe-kernels "$last"
rm -f "$OUT"/build.log "$OUT"/configure.log "$OUT"/gpu_tests.log "$OUT"/post.log "$OUT"/env.txt
