#!/usr/bin/env bash
# End-to-end GPU benchmarks of the CUDA backend (issue #6), on the GPU machine, from the repo
# root with OUT set; carry .debs and .shared (../shared/DEVICE.md). Two phases, each fits one
# 10-minute device call:
#   E2E_PHASE=tests OUT=... bash scripts/gpu_e2e_bench.sh
#       build (scripts/gpu_run.sh), make the tiny random models, measure Hugging Face's own
#       bf16/fp16-vs-fp32 logit differences (tests/tools/hf_bf16_tolerance.py ->
#       $OUT/hf_half_precision_tolerance.json), run the GPU tests (ctest -L gpu; engine_gpu_test's
#       token agreement lines -> $OUT/engine_invariance_gpu.txt)
#   E2E_PHASE=bench OUT=... bash scripts/gpu_e2e_bench.sh
#       ceilings (copy bandwidth, cuBLASLt bf16 GEMM), then `llm bench --device cuda
#       --load-format dummy` runs: batch-1 decode latency (Llama-2-7B, 128 + 256 tokens),
#       time to first token (Llama-3-8B, 2,048-token prompt, idle engine), offline throughput
#       (Llama-3-8B, E2E_REQUESTS x (1,000 prompt + 1,000 output), ignore_eos), decode-heavy
#       throughput at 256 concurrent sequences (GPU busy fraction), long context (Llama-3.1-8B,
#       (async scheduling is the cuda default; the *_sync runs are the --no-async-scheduling
#       baselines, *_cublaslt --gemv-max-tokens 0, *_no_pdl --disable-pdl, *_autotune
#       --gemm-autotune)
#       one 131,008-token prompt + 64 tokens); bench/e2e_report.py -> $OUT/e2e-h200.json +
#       $OUT/e2e-summary.md
# Every run is bounded by `timeout`; a failed run is recorded and the next goes on.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PHASE=${E2E_PHASE:-tests}
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared

if [ "$PHASE" = tests ]; then
  # Build only (no tests yet: the executor test reads the tolerance measured next).
  GPU_TEST_REGEX='^$' OUT=$OUT bash scripts/gpu_run.sh \
    llm cuda_executor_gpu_test engine_gpu_test gemv_gpu_test gemv_fused_gpu_test model_ops_gpu_test sampling_gpu_test sampling_gumbel_gpu_test \
    prefill_attention_gpu_test \
    decode_attention_gpu_test rmsnorm_gpu_test bench_gemm_peak_gpu bench_copy_bandwidth_gpu \
    bench_decode_attention_gpu cuda_async_gpu_test cuda_step_failure_gpu_test \
    demo_model cuda_tp_gpu_test all_reduce_gpu_test bench_all_reduce_gpu kv_fp8_attention_gpu_test kv_fp8_append_gpu_test \
    bench_prefill_attention_gpu fp8_linear_gpu_test \
    2>&1 | tail -30
  tiny=/tmp/tiny_models && mkdir -p $tiny
  for m in hd128 hd64; do
    build/llm make-model --config tests/data/tiny_models/$m.json --out $tiny/$m --seed 7 \
      --dtype f32 --tokenizer "$shared/models/stories260K/tokenizer.model" > /dev/null
  done
  if [ ! -f tests/data/hf_half_precision_tolerance.json ]; then
    timeout 180 python3 tests/tools/hf_bf16_tolerance.py \
      --model stories260K="$shared/models/stories260K" --model hd128=$tiny/hd128 \
      --model hd64=$tiny/hd64 --out tests/data/hf_half_precision_tolerance.json 2>&1 | tail -8
    cp tests/data/hf_half_precision_tolerance.json "$OUT/"
  fi
  (cd build && ctest -L gpu -R "${GPU_TEST_REGEX:-.}" --output-on-failure --timeout 300) 2>&1 \
    | tee "$OUT/gpu_tests.log" | grep -vE "^\s+[0-9]+/[0-9]+ Test.*Passed" | tail -60
  build/cuda_executor_gpu_test 2>&1 | grep -E "^  (stories|hd|KV blocks)" | tee "$OUT/executor_numbers.txt"
  # engine_gpu_test's measured token agreement (one line per comparison), from ctest's log.
  grep -h '^\[invariance\]' build/Testing/Temporary/LastTest.log | tee "$OUT/engine_invariance_gpu.txt"
  timeout 60 build/llm generate --device cuda --model "$shared/models/stories260K" \
    --prompt "Once upon a time" --temperature 0 --max-tokens 40 2>&1 | tail -4
  exit 0
fi

RESULTS=$OUT/e2e-runs.jsonl
: > "$RESULTS"
# run NAME TIMEOUT ARGS...   (E2E_RUNS="name ..." selects runs)
source scripts/bench_run.sh
BENCH_RESULTS=$RESULTS BENCH_LOG=$OUT/e2e.log BENCH_SELECT=${E2E_RUNS:-}
BENCH_TOKENIZER=$shared/models/stories260K
run() { bench_run "$@"; }
timeout 60 build/bench_copy_bandwidth_gpu > "$OUT/ceilings.txt" 2>&1
# E2E_GEMM_PEAK=0: the copy bandwidth only (the GEMM sweep takes a minute or two).
[ "${E2E_GEMM_PEAK:-1}" = 0 ] || timeout 120 build/bench_gemm_peak_gpu >> "$OUT/ceilings.txt" 2>&1
cat "$OUT/ceilings.txt"
C7=engine/configs/llama-2-7b.json
C8=engine/configs/llama-3-8b.json
C31=engine/configs/llama-3.1-8b.json
run latency_7b_b1 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256
run latency_7b_b1_cublaslt 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 --gemv-max-tokens 0
run latency_7b_b1_no_pdl 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 --disable-pdl
run latency_7b_b1_sync 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 --no-async-scheduling
# One copy per step input array (--no-packed-step-inputs, the default before 2026-11-30)
# and the decode split selector's previous rule (at least 2 tiles per split).
run latency_7b_b1_unpacked 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 --no-packed-step-inputs
run latency_7b_b1_split2 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 \
  --decode-min-tiles-per-split 2
run latency_8b_b1 150 --model $C8 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256
run ttft_8b_2048 150 --model $C8 --num-requests 1 --min-input 2048 --max-input 2048 \
  --min-output 1 --max-output 1 --temperature 0 --warmup --max-num-batched-tokens 2048
run ttft_8b_2048_fp8 150 --model $C8 --num-requests 1 --min-input 2048 --max-input 2048 \
  --min-output 1 --max-output 1 --temperature 0 --warmup --max-num-batched-tokens 2048 \
  --kv-cache-dtype fp8
run ttft_8b_2048_fp8_mma 150 --model $C8 --num-requests 1 --min-input 2048 --max-input 2048 \
  --min-output 1 --max-output 1 --temperature 0 --warmup --max-num-batched-tokens 2048 \
  --kv-cache-dtype fp8 --no-fp8-prefill-wgmma
run decode_8b_256seq 200 --model $C8 --num-requests 256 --min-input 128 --max-input 128 \
  --min-output 512 --max-output 512 --max-num-seqs 256 --max-num-batched-tokens 8192 --warmup
run decode_8b_256seq_sync 200 --model $C8 --num-requests 256 --min-input 128 --max-input 128 \
  --min-output 512 --max-output 512 --max-num-seqs 256 --max-num-batched-tokens 8192 --warmup \
  --no-async-scheduling
run throughput_8b 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" --min-input 1000 \
  --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 256 \
  --max-num-batched-tokens 8192 --temperature 1.0
run throughput_8b_sync 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" --min-input 1000 \
  --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 256 \
  --max-num-batched-tokens 8192 --temperature 1.0 --no-async-scheduling
run throughput_8b_512seq 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" --min-input 1000 \
  --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0
# --kv-cache-dtype fp8 (e4m3 KV cache: half the bytes per token, twice the tokens in memory)
run throughput_8b_fp8 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" --min-input 1000 \
  --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 256 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8
run throughput_8b_fp8_512seq 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8
# The same with the fp8 prefill on the mma.sync rung (no bf16 copy of the pages), for A/Bs.
run throughput_8b_fp8_512seq_mma 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --no-fp8-prefill-wgmma
# cuBLASLt algorithms timed at start-up (--gemm-autotune) instead of the heuristic's picks
run throughput_8b_fp8_512seq_autotune 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --gemm-autotune
run throughput_8b_fp8_768seq 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 768 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8
run decode_8b_256seq_fp8 200 --model $C8 --num-requests 256 --min-input 128 --max-input 128 \
  --min-output 512 --max-output 512 --max-num-seqs 256 --max-num-batched-tokens 8192 --warmup \
  --kv-cache-dtype fp8
run latency_8b_b1_fp8 150 --model $C8 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 \
  --kv-cache-dtype fp8
# --quantization fp8 (W8A8: e4m3 linear weights with per-row scales, per-token e4m3
# activations, cuBLASLt FP8 GEMMs); the *_w8 runs, with the fp8 KV cache where named
run throughput_8b_w8_fp8kv_512seq 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8
run throughput_8b_w8_fp8kv_512seq_precise 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8 \
  --fp8-precise-accum
# Issue 29 target 3's other two published shapes (TensorRT-LLM, Llama-3.1-8B FP8, H200):
# 128 / 128 (27,911 output tok/s) and 2,048 / 2,048 (12,194).
for s in 512 1024 2048; do
  run throughput_8b_w8_fp8kv_128_${s}seq 300 --model $C8 --num-requests "${E2E_REQUESTS_SHORT:-8192}" \
    --min-input 128 --max-input 128 --min-output 128 --max-output 128 --max-num-seqs $s \
    --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8
done
run throughput_8b_w8_fp8kv_128_1024seq_16k 300 --model $C8 --num-requests "${E2E_REQUESTS_SHORT:-8192}" \
  --min-input 128 --max-input 128 --min-output 128 --max-output 128 --max-num-seqs 1024 \
  --max-num-batched-tokens 16384 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8
run throughput_8b_w8_fp8kv_2048_512seq 400 --model $C8 --num-requests "${E2E_REQUESTS_LONG:-1000}" \
  --min-input 2048 --max-input 2048 --min-output 2048 --max-output 2048 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8
# --decode-overlap (two halves of each decode step on two streams): the issue's 1,000 / 1,000
# shape, and a decode-heavy A/B (512 sequences of 1,000 + 256 tokens) with the GEMMs' SM
# count target at all SMs, 100 and 88.
run throughput_8b_w8_fp8kv_512seq_overlap 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8 \
  --decode-overlap
# The same 1,000 / 1,000 run with the KV pool at 0.95 of the GPU's memory (TensorRT-LLM's published
# runs give its KV cache 0.95 of the free memory): on an H100 the 0.90 default's pool (986k fp8
# tokens) holds about 490 sequences of 2,000 tokens, so 1,000 requests run in three waves, the
# last of a few sequences (2,875 decode steps on 2026-12-07); at 0.95 all 512 should fit.
run throughput_8b_w8_fp8kv_512seq_mem95 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 512 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8 \
  --gpu-memory-utilization 0.95
for ov in "" "--decode-overlap" "--decode-overlap --decode-overlap-gemm-sms 100" \
  "--decode-overlap --decode-overlap-gemm-sms 88"; do
  tag=$(echo "$ov" | sed -e 's/--decode-overlap-gemm-sms /_sm/' -e 's/--decode-overlap/_overlap/' -e 's/ //g')
  run decode_8b_w8_fp8kv_512x1000${tag} 300 --model $C8 --num-requests 512 --min-input 1000 \
    --max-input 1000 --min-output 256 --max-output 256 --max-num-seqs 512 \
    --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8 $ov
done
run throughput_8b_w8_fp8kv_768seq 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 768 \
  --max-num-batched-tokens 8192 --temperature 1.0 --kv-cache-dtype fp8 --quantization fp8
run throughput_8b_w8_256seq 400 --model $C8 --num-requests "${E2E_REQUESTS:-1000}" \
  --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 256 \
  --max-num-batched-tokens 8192 --temperature 1.0 --quantization fp8
run decode_8b_256seq_w8 200 --model $C8 --num-requests 256 --min-input 128 --max-input 128 \
  --min-output 512 --max-output 512 --max-num-seqs 256 --max-num-batched-tokens 8192 --warmup \
  --quantization fp8
run ttft_8b_2048_w8 150 --model $C8 --num-requests 1 --min-input 2048 --max-input 2048 \
  --min-output 1 --max-output 1 --temperature 0 --warmup --max-num-batched-tokens 2048 \
  --quantization fp8
run latency_7b_b1_w8 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 \
  --quantization fp8
# The ring GEMV (--gemv-ring: weights through shared-memory stages filled from the kernel's start).
run latency_7b_b1_w8_ring 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 \
  --quantization fp8 --gemv-ring
run latency_7b_b1_ring 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 --gemv-ring
# The chained MLP (--gemv-chain: o, gate|up, down in one kernel, the RMSNorms folded), the fold
# alone, and the balanced GEMV grid (--gemv-balanced-grid).
for v in chain:--gemv-chain fold:--gemv-fold-norm balanced:--gemv-balanced-grid; do
  run "latency_7b_b1_w8_${v%%:*}" 150 --model $C7 --num-requests 1 --min-input 128 \
    --max-input 128 --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 \
    --quantization fp8 "${v#*:}"
  run "latency_7b_b1_${v%%:*}" 150 --model $C7 --num-requests 1 --min-input 128 --max-input 128 \
    --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 "${v#*:}"
done
run latency_8b_b1_w8_ring 150 --model $C8 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 \
  --quantization fp8 --gemv-ring
run latency_8b_b1_w8 150 --model $C8 --num-requests 1 --min-input 128 --max-input 128 \
  --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256 \
  --quantization fp8
run long_context_8b_128k_w8 300 --model $C31 --num-requests 1 --min-input 131008 \
  --max-input 131008 --min-output 64 --max-output 64 --max-num-seqs 8 \
  --max-num-batched-tokens 8192 --temperature 0 --quantization fp8
run long_context_8b_128k_fp8 300 --model $C31 --num-requests 1 --min-input 131008 \
  --max-input 131008 --min-output 64 --max-output 64 --max-num-seqs 8 \
  --max-num-batched-tokens 8192 --temperature 0 --kv-cache-dtype fp8
run long_context_8b_128k_fp8_mma 300 --model $C31 --num-requests 1 --min-input 131008 \
  --max-input 131008 --min-output 64 --max-output 64 --max-num-seqs 8 \
  --max-num-batched-tokens 8192 --temperature 0 --kv-cache-dtype fp8 --no-fp8-prefill-wgmma
run long_context_8b_128k 300 --model $C31 --num-requests 1 --min-input 131008 \
  --max-input 131008 --min-output 64 --max-output 64 --max-num-seqs 8 \
  --max-num-batched-tokens 8192 --temperature 0
python3 bench/e2e_report.py --runs "$RESULTS" --ceilings "$OUT/ceilings.txt" \
  --json "$OUT/e2e-h200.json" --md "$OUT/e2e-summary.md"
cat "$OUT/e2e-summary.md"
