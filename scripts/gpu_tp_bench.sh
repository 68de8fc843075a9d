#!/usr/bin/env bash
# Tensor parallelism (issue #10) on a machine of several GPUs (nvidia-h200-x2), in one device
# call, from the repo root with OUT set; carry .debs and .shared (../shared/DEVICE.md):
#   build (scripts/gpu_run.sh; NCCL from the CUDA toolkit or PyTorch's wheel), the TP GPU
#   test (cuda_tp_gpu_test: TP=2 vs TP=1 logits and greedy tokens), then `llm bench --device
#   cuda --load-format dummy` at TP=1 and TP=2 on the same machine: batch-1 decode latency and
#   decode-heavy throughput (Llama-3-8B shape), offline throughput (TP_REQUESTS x (1,000 +
#   1,000)), and a Llama-3-70B shape at TP=2 (which one H200 cannot hold in bf16 with a KV
#   cache); the *_nccl runs turn the one-shot peer all-reduce off (--disable-custom-all-reduce).
#   Results: $OUT/tp-runs.jsonl, $OUT/tp-summary.md (scaling efficiency).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): the device tool's rule for shared hosts.
#   TP_PHASE=all|tests|bench   TP_RUNS="name ..." selects bench runs
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PHASE=${TP_PHASE:-all}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
{ nvidia-smi topo -m; nvidia-smi --query-gpu=index,name,memory.total --format=csv; } \
  > "$OUT/topology.txt" 2>&1
if [ "$PHASE" != bench ]; then
  GPU_TEST_REGEX='^$' OUT=$OUT bash scripts/gpu_run.sh llm cuda_tp_gpu_test all_reduce_gpu_test \
    bench_copy_bandwidth_gpu bench_all_reduce_gpu 2>&1 | tail -25
  (cd build && ctest -L gpu -R 'cuda_tp|all_reduce' --output-on-failure --timeout 200) 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -25
  grep -h '^\[tp\]' build/Testing/Temporary/LastTest.log | tee "$OUT/tp_test_numbers.txt"
  [ "$PHASE" = tests ] && exit 0
fi
export PATH=/opt/deps/usr/bin:$PATH
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
RESULTS=$OUT/tp-runs.jsonl
: > "$RESULTS"
source scripts/bench_run.sh
BENCH_RESULTS=$RESULTS BENCH_LOG=$OUT/tp.log BENCH_SELECT=${TP_RUNS:-}
BENCH_TOKENIZER=$shared/models/stories260K
run() { bench_run "$@"; }
timeout 60 build/bench_copy_bandwidth_gpu > "$OUT/ceilings.txt" 2>&1
timeout 120 build/bench_all_reduce_gpu 2>&1 | tee "$OUT/all_reduce.txt"
C8=engine/configs/llama-3-8b.json
C70=engine/configs/llama-3-70b.json
B1="--num-requests 1 --min-input 128 --max-input 128 --min-output 256 --max-output 256 --temperature 0 --warmup --max-num-seqs 256"
DEC="--num-requests 256 --min-input 128 --max-input 128 --min-output 512 --max-output 512 --max-num-seqs 256 --max-num-batched-tokens 8192 --warmup"
THR="--num-requests ${TP_REQUESTS:-400} --min-input 1000 --max-input 1000 --min-output 1000 --max-output 1000 --max-num-seqs 256 --max-num-batched-tokens 8192 --temperature 1.0"
for tp in 1 2; do
  run latency_8b_b1_tp$tp 150 --model $C8 $B1 --tensor-parallel-size $tp
  run decode_8b_256seq_tp$tp 200 --model $C8 $DEC --tensor-parallel-size $tp
  run throughput_8b_tp$tp 300 --model $C8 $THR --tensor-parallel-size $tp
done
# The same TP=2 runs with every all-reduce through NCCL (no one-shot peer kernel).
run latency_8b_b1_tp2_nccl 150 --model $C8 $B1 --tensor-parallel-size 2 --disable-custom-all-reduce
run decode_8b_256seq_tp2_nccl 200 --model $C8 $DEC --tensor-parallel-size 2 --disable-custom-all-reduce
run latency_70b_b1_tp2 200 --model $C70 $B1 --tensor-parallel-size 2
run latency_70b_b1_tp2_nccl 200 --model $C70 $B1 --tensor-parallel-size 2 --disable-custom-all-reduce
run decode_70b_256seq_tp2 300 --model $C70 $DEC --tensor-parallel-size 2
python3 - "$RESULTS" "$OUT/ceilings.txt" > "$OUT/tp-summary.md" <<'PY'
import json, re, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[r["name"]] = r.get("result")
bw = None
for line in open(sys.argv[2]):
    m = re.search(r'"tb_per_s":([0-9.]+)', line)
    if m and bw is None:
        bw = float(m.group(1))
print(f"copy bandwidth (one GPU): {bw} TB/s\n")
print("| run | tok/s (generated) | ms/token (tpot p50) | GPU busy | weight bytes/token/GPU |")
print("|---|---|---|---|---|")
for name, r in runs.items():
    if not r:
        print(f"| {name} | FAILED | | | |")
        continue
    print(f"| {name} | {r['generated_tokens_per_s']:.0f} | {r['tpot_ms_p50']:.3f} | "
          f"{r.get('gpu_busy_fraction', 0):.3f} | {r.get('weight_bytes_per_token', 0)/1e9:.2f} GB |")
def ratio(a, b, key, inv=False):
    if runs.get(a) and runs.get(b):
        x, y = runs[a][key], runs[b][key]
        return y / x if inv else x / y
for model in ["latency_8b_b1", "decode_8b_256seq", "throughput_8b"]:
    if model.startswith("latency"):
        s = ratio(f"{model}_tp1", f"{model}_tp2", "tpot_ms_p50")
        label = "speed-up of ms/token"
    else:
        s = ratio(f"{model}_tp2", f"{model}_tp1", "generated_tokens_per_s")
        label = "throughput ratio"
    if s:
        print(f"\n{model}: TP=2 / TP=1 {label} = {s:.3f}, scaling efficiency {s/2:.3f}")
PY
cat "$OUT/tp-summary.md"
