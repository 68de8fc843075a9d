# Sourced by the GPU benchmark scripts (gpu_e2e_bench.sh, gpu_tp_bench.sh): one function that
# runs `llm bench --device cuda --load-format dummy` and appends its JSON line to a results file.
#   BENCH_RESULTS  the .jsonl it appends {"name": ..., "result": {...}} (or "error") to
#   BENCH_LOG      where llm's stderr goes
#   BENCH_SELECT   "name name ...": only these runs (empty: all)
#   BENCH_TOKENIZER  a tokenizer folder for the dummy models
# bench_run NAME TIMEOUT_S LLM_BENCH_ARGS...   (a failed run is recorded and the next goes on)
bench_run() {
  local name=$1 t=$2
  shift 2
  if [ -n "${BENCH_SELECT:-}" ] && [[ " $BENCH_SELECT " != *" $name "* ]]; then return; fi
  echo "== $name: llm bench $*" | tee -a "$BENCH_LOG"
  local line
  line=$(timeout "$t" build/llm bench --device cuda --load-format dummy \
    --tokenizer "$BENCH_TOKENIZER" "$@" 2>>"$BENCH_LOG" | tail -1)
  local rc=$?
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    echo "{\"name\": \"$name\", \"error\": \"exit $rc\"}" >> "$BENCH_RESULTS"
    echo "   FAILED (exit $rc)"
  else
    echo "{\"name\": \"$name\", \"result\": $line}" >> "$BENCH_RESULTS"
    echo "   $line" | cut -c1-400
  fi
}
