#!/usr/bin/env bash
# Where v4's time goes (issue #5): on the GPU machine after a build (scripts/gpu_run.sh with
# bench_prefill_attention_gpu). Times v4 and its ablations (loads alone, math alone, no exp2,
# the other schedules) at hd128/hd64 causal 8k over block sizes, then profiles one hd128 8k
# launch with Nsight Compute at the running clocks. Writes at most 4 files to $OUT:
#   prefill_profile.jsonl   bench JSON lines (block_size in each)
#   ncu_details.txt         the full set's details page
#   ncu_metrics.txt         stall reasons, pipes, shared memory / L2 / TMA counters (raw page)
#   ncu_sass.csv            per-SASS-instruction counters and stall samples
#   OUT=... bash scripts/gpu_prefill_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=build/bench_prefill_attention_gpu
for bs in ${PROFILE_BLOCK_SIZES:-16 32 64 128}; do
  timeout 150 $B --shapes ${PROFILE_SHAPES:-128:8192,64:8192} --variants v4 --block-size "$bs" \
    2>&1 | grep -E "^JSON|FAILED" | sed 's/^JSON //' >> "$OUT/prefill_profile.jsonl"
done
python3 - "$OUT/prefill_profile.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try: r = json.loads(line.replace(':nan', ':null'))  # profiling rows have no max_err
    except Exception: print(line.strip()); continue
    print(f"hd{r['head_dim']:4d} L{r['seq_len']:6d} bs{r['block_size']:4d} {r['variant']:12s} {r['tflops']:7.1f} TFLOP/s {r['ms']:.4f} ms")
PY
[ "${PROFILE_NCU:-1}" = 1 ] || exit 0
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "no ncu"; exit 0; fi
rep=/tmp/v4_8k
timeout 300 "$NCU" --clock-control none --kernel-name regex:PrefillWgmma --launch-skip 1 \
  --launch-count 1 --set full --import-source no -o $rep -f \
  $B --shapes 128:8192 --variants v4 --no-ablations --reps 1 > /tmp/ncu_run.log 2>&1
tail -3 /tmp/ncu_run.log
"$NCU" --import $rep.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
"$NCU" --import $rep.ncu-rep --page raw 2>&1 | grep -E "stall|pipe_tensor|gmma|shared|lsu|tma|l1tex__data|lts__t_(sectors|requests)|sm__cycles|smsp__inst_executed\.|dram__bytes|l1tex__throughput|sm__throughput" \
  > "$OUT/ncu_metrics.txt"
"$NCU" --import $rep.ncu-rep --page source --print-source sass --csv > "$OUT/ncu_sass.csv" 2>&1
grep -E "Duration|SM Frequency|Pipe|Issue Slots|Eligible|Warp Cycles" "$OUT/ncu_details.txt" | head -20
grep -E "issue_stalled.*ratio|warp_latency_issue_stalled" "$OUT/ncu_metrics.txt" | sort -k3 -g -r | head -30
