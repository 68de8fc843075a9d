#!/usr/bin/env bash
# GPU attention benchmarks in ONE call on the GPU machine (../shared/DEVICE.md), from the repo
# root with OUT set; carry .debs and .shared:
#   OUT=/some/dir bash scripts/gpu_attention_bench.sh
# Steps (each bounded by `timeout` and by a whole-run budget, GPU_BENCH_BUDGET_S, default 570 s;
# a failed step is recorded and the run goes on):
#   1. scripts/gpu_run.sh: build the targets below, run every GPU test (ctest -L gpu)
#   2. build/bench_copy_bandwidth_gpu, build/bench_decode_attention_gpu,
#      build/bench_prefill_attention_gpu (a missing binary is reported and skipped;
#      extra arguments: COPY_BENCH_ARGS, DECODE_BENCH_ARGS, PREFILL_BENCH_ARGS)
#   3. python3 bench/attention_torch.py (torch SDPA FA2 / cuDNN baselines, torch copy)
#   4. python3 bench/attention_report.py -> attention-h200.json, attention-h200.png, table
#   5. compute-sanitizer memcheck + racecheck on the attention benches, SMALL shape
#      (ATTN_SKIP_SANITIZER=1 skips it)
#   6. the report again (with the sanitizer step), then the markdown table, printed last
# ATTN_EXTRA_TARGETS="t1 t2 ...": more ninja targets for step 1 (e.g. every *_gpu_test, so that
# the one call runs the whole GPU suite for real instead of reporting the unbuilt ones).
# Contract with the bench binaries:
#   - results are lines `JSON {...}` on stdout (kind decode: batch, context, num_heads,
#     num_kv_heads, head_dim, ms, tb_per_s, ...; kind prefill: batch, seq_len, num_heads,
#     head_dim, causal, ms, tflops, ...; "variant" names the kernel; an "error" key or
#     "ok": false marks a failed check; exit status non-zero on any failed check);
#   - `--sanitize-small`: run one small shape per variant, a couple of iterations, checks on,
#     then exit (for compute-sanitizer). The step greps the binary for that string and skips
#     it when absent, so a binary without the flag is never run at full size under the tool.
# Files written to $OUT (at most 8): build_and_tests.log, bench.log, attention-h200.json,
# attention-h200.png, sanitizer.txt, summary.md. Exit status 0 when every step passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUDGET=${GPU_BENCH_BUDGET_S:-570}
T0=$SECONDS
WORK=${TMPDIR:-/tmp}/gpu_attention_bench.$$
rm -rf "$WORK" && mkdir -p "$WORK"
PY=$(command -v python3 || echo python3)
DEPS_LD=/opt/deps/usr/lib/x86_64-linux-gnu
TARGETS=(bench_copy_bandwidth_gpu bench_decode_attention_gpu bench_prefill_attention_gpu
         decode_attention_gpu_test prefill_attention_gpu_test rmsnorm_gpu_test)
# shellcheck disable=SC2206  # a space-separated list on purpose
TARGETS+=(${ATTN_EXTRA_TARGETS:-})
BUILD_LOG=$OUT/build_and_tests.log
BENCH_LOG=$OUT/bench.log
SAN=$OUT/sanitizer.txt
SUMMARY=$OUT/summary.md
NAME=attention-h200
rm -f "$BUILD_LOG" "$BENCH_LOG" "$SAN" "$SUMMARY" "$OUT/$NAME.json" "$OUT/$NAME.png"
: > "$BENCH_LOG"
STEPS=()
FAILED=0

now() { echo $((SECONDS - T0)); }
remaining() { echo $((BUDGET - (SECONDS - T0))); }
# Seconds a step may take: min(cap, remaining - reserve) (0 when none are left).
allot() {
  local cap=$1 reserve=$2 t
  t=$(($(remaining) - reserve))
  ((t > cap)) && t=$cap
  ((t < 0)) && t=0
  echo "$t"
}
status_of() {
  case $1 in
    0) echo ok ;;
    124 | 137) echo timeout ;;
    126 | 127) echo "not-runnable" ;;
    *) if (($1 > 128)); then echo "crashed(signal $(($1 - 128)))"; else echo "failed(rc=$1)"; fi ;;
  esac
}
# record NAME RC SECONDS STATUS [NOTE]
record() {
  local name=$1 rc=$2 secs=$3 st=$4 note=${5:-}
  note=${note//\\/\\\\}
  note=${note//\"/\\\"}
  STEPS+=("$(printf '%-34s %-22s %4ss %s' "$name" "$st" "$secs" "$note")")
  printf 'STEP {"step":"%s","rc":%s,"status":"%s","seconds":%s,"note":"%s"}\n' \
    "$name" "$rc" "$st" "$secs" "$note" >> "$BENCH_LOG"
  case $st in ok | skipped*) ;; *) FAILED=1 ;; esac
}
say() { echo "[gpu_attention_bench $(now)s] $*"; }

GPU=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
GPU=${GPU:-unknown GPU}
gpu_state() {
  echo "nvidia-smi ($1): $(timeout 20 nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,memory.used --format=csv,noheader 2>&1 | head -1)"
}
{ echo "=== gpu_attention_bench $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $GPU, budget ${BUDGET}s"
  gpu_state start; } >> "$BENCH_LOG"

# ---- 1. build + GPU tests (scripts/gpu_run.sh, its logs combined into one file) ----------
say "build + GPU tests: ${TARGETS[*]}"
t=$(allot 330 230)
s0=$(now)
GR_OUT=$WORK/gpu_run
mkdir -p "$GR_OUT"
if ((t < 20)); then
  record build_and_gpu_tests 0 0 "skipped: no time"
else
  (unset GPU_TEST_REGEX GPU_POST; OUT=$GR_OUT timeout -k 15 "$t" bash scripts/gpu_run.sh -k 0 "${TARGETS[@]}") \
    > "$WORK/gpu_run.console" 2>&1
  rc=$?
  note=""
  # gpu_run.sh stops before ctest when the build failed; run the tests that did build.
  if ((rc != 0)) && [ -f build/build.ninja ] && [ ! -s "$GR_OUT/gpu_tests.log" ]; then
    t2=$(allot 120 230)
    if ((t2 >= 15)); then
      note="build failed (see build_and_tests.log); ran ctest -L gpu on what built"
      (cd build && env PATH="/opt/deps/usr/bin:$PATH" LD_LIBRARY_PATH="$DEPS_LD:${LD_LIBRARY_PATH:-}" \
        timeout -k 10 "$t2" ctest -L gpu --output-on-failure --timeout 100) > "$GR_OUT/gpu_tests.log" 2>&1
    fi
  fi
  tests_line=$(grep -E 'tests passed|No tests were found' "$GR_OUT/gpu_tests.log" 2>/dev/null | tail -1)
  record build_and_gpu_tests "$rc" $(($(now) - s0)) "$(status_of "$rc")" "${note:+$note; }${tests_line}"
fi
{
  for f in env.txt configure.log build.log gpu_tests.log post.log; do
    [ -f "$GR_OUT/$f" ] && { echo "===== $f"; cat "$GR_OUT/$f"; }
  done
  echo "===== gpu_run.sh console"; cat "$WORK/gpu_run.console" 2>/dev/null
} > "$BUILD_LOG"

# ---- 2. our benches --------------------------------------------------------------------
# bench NAME CAP RESERVE EXTRA_ARGS
bench() {
  local name=$1 cap=$2 reserve=$3 extra=$4 bin="build/$1" t rc s0
  s0=$(now)
  if [ ! -x "$bin" ]; then
    echo "=== $name: binary absent (build failed or source missing), skipped" >> "$BENCH_LOG"
    record "$name" 127 0 "missing" "build/$name absent"
    return
  fi
  t=$(allot "$cap" "$reserve")
  if ((t < 10)); then record "$name" 0 0 "skipped: no time"; return; fi
  say "$name (timeout ${t}s)"
  echo "=== $name $extra (timeout ${t}s)" >> "$BENCH_LOG"
  # shellcheck disable=SC2086  # extra arguments are split on purpose
  timeout -k 10 "$t" env LD_LIBRARY_PATH="$DEPS_LD:${LD_LIBRARY_PATH:-}" "$bin" $extra >> "$BENCH_LOG" 2>&1
  rc=$?
  record "$name" "$rc" $(($(now) - s0)) "$(status_of "$rc")"
}
bench bench_copy_bandwidth_gpu 60 220 "${COPY_BENCH_ARGS:-}"
bench bench_decode_attention_gpu 150 180 "${DECODE_BENCH_ARGS:-}"
bench bench_prefill_attention_gpu 150 140 "${PREFILL_BENCH_ARGS:-}"
gpu_state "after our benches" >> "$BENCH_LOG"

# ---- 3. torch baselines ----------------------------------------------------------------
t=$(allot 220 35)
s0=$(now)
if ((t < 20)); then
  record attention_torch 0 0 "skipped: no time"
else
  say "torch SDPA baselines (timeout ${t}s)"
  echo "=== python3 bench/attention_torch.py --budget $((t - 25)) (timeout ${t}s)" >> "$BENCH_LOG"
  timeout -k 10 "$t" "$PY" bench/attention_torch.py --budget $((t - 25)) >> "$BENCH_LOG" 2>&1
  rc=$?
  record attention_torch "$rc" $(($(now) - s0)) "$(status_of "$rc")"
fi
gpu_state "after torch" >> "$BENCH_LOG"

# ---- 4. report ---------------------------------------------------------------------------
CMD="OUT=$OUT bash scripts/gpu_attention_bench.sh (commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))"
report() {
  local t
  t=$(allot 60 0)
  ((t < 5)) && t=5
  timeout -k 5 "$t" "$PY" bench/attention_report.py --out-dir "$OUT" --name "$NAME" --gpu "$GPU" \
    --command "$CMD" --table "$SUMMARY" "$BENCH_LOG" > "$WORK/report.out" 2> "$WORK/report.err"
}
say "report"
s0=$(now)
report
rc=$?
record attention_report "$rc" $(($(now) - s0)) "$(status_of "$rc")" "$(tail -1 "$WORK/report.err" 2>/dev/null)"

# ---- 5. compute-sanitizer on a small shape ---------------------------------------------------
CS=$(command -v compute-sanitizer 2>/dev/null)
if [ -z "$CS" ]; then
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
           /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && { CS=$c; break; }
  done
fi
{
  echo "compute-sanitizer on the attention benches with --sanitize-small, $(date -u '+%F %T UTC'), $GPU"
  echo "tool: ${CS:-not found}"
} > "$SAN"
if [ "${ATTN_SKIP_SANITIZER:-0}" = 1 ]; then
  echo "skipped: ATTN_SKIP_SANITIZER=1" >> "$SAN"
  record sanitizer 0 0 "skipped: ATTN_SKIP_SANITIZER=1"
elif [ -z "$CS" ]; then
  record sanitizer 0 0 "skipped: no compute-sanitizer" "not on PATH nor under /usr/local/cuda*/bin"
else
  for b in bench_decode_attention_gpu bench_prefill_attention_gpu; do
    bin=build/$b
    if [ ! -x "$bin" ]; then
      echo "== $b: binary absent, skipped" >> "$SAN"
      record "sanitizer:$b" 0 0 "skipped: binary absent"
      continue
    fi
    if ! grep -qaF -- '--sanitize-small' "$bin"; then
      echo "== $b: does not accept --sanitize-small, skipped" >> "$SAN"
      record "sanitizer:$b" 0 0 "skipped: no --sanitize-small"
      continue
    fi
    for tool in memcheck racecheck; do
      t=$(allot 90 20)
      s0=$(now)
      if ((t < 15)); then
        echo "== $b $tool: no time left, skipped" >> "$SAN"
        record "sanitizer:$b:$tool" 0 0 "skipped: no time"
        continue
      fi
      say "compute-sanitizer --tool $tool $b --sanitize-small (timeout ${t}s)"
      log=$WORK/san_${b}_$tool.log
      timeout -k 10 "$t" env LD_LIBRARY_PATH="$DEPS_LD:${LD_LIBRARY_PATH:-}" \
        "$CS" --tool "$tool" --error-exitcode 99 --print-limit 20 "$bin" --sanitize-small > "$log" 2>&1
      rc=$?
      summ=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY' "$log" | tail -2 | tr '\n' ' ')
      {
        echo "== $b $tool: rc=$rc ($(status_of "$rc")), $(($(now) - s0)) s: ${summ:-no summary line}"
        grep -E '^=========' "$log" | head -60
        echo "-- last lines of the program's output:"
        grep -vE '^=========' "$log" | tail -15
      } >> "$SAN"
      st=$(status_of "$rc")
      ((rc == 99)) && st="errors-found"
      record "sanitizer:$b:$tool" "$rc" $(($(now) - s0)) "$st" "$summ"
    done
  done
fi

# ---- 6. report again (now with the sanitizer steps), then the table last ------------------
if (($(remaining) > 8)); then report || true; fi
gpu_state end >> "$BENCH_LOG"
echo
echo "== steps (${BUDGET}s budget, $(now)s used); files in $OUT: $(cd "$OUT" && printf "%s " *)"
printf '  %s\n' "${STEPS[@]}"
grep -E '^== .*(rc=|skipped)' "$SAN" 2>/dev/null | sed 's/^/  /'
if [ -s "$SUMMARY" ]; then
  echo
  cat "$SUMMARY"
else
  echo "report failed; its stderr:"
  tail -20 "$WORK/report.err" 2>/dev/null
  echo "JSON lines seen:"
  grep -E '^JSON ' "$BENCH_LOG" | cut -c1-200 | tail -40
fi
rm -rf "$WORK"
exit "$FAILED"
