#!/usr/bin/env bash
# head_dim 256 (Gemma 3) on the H200: build, the attention GPU tests, the kernels' register /
# shared-memory usage, then the decode and prefill benches (post.sh). One `run` call:
#   OUT=$OUT bench/results/hd256-h200/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/out}
export GPU_TEST_REGEX='decode_attention|prefill_attention|sliding_window|kv_fp8_attention'
export GPU_POST='bash bench/results/hd256-h200/post.sh'
scripts/gpu_run.sh decode_attention_gpu_test prefill_attention_gpu_test sliding_window_gpu_test \
  kv_fp8_attention_gpu_test bench_decode_attention_gpu bench_prefill_attention_gpu
