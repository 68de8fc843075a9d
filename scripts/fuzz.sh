#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan, in build-fuzz/) and runs each
# on a copy of its seed corpus, LLM_FUZZ_JOBS targets at a time (default: the cores; each
# libFuzzer process uses one). Exits non-zero on any crash, leak or timeout; the crash file's
# path is printed. Needs clang, libclang-rt-14-dev and libomp-dev
# (scripts/deps.sh); installs nothing itself.
#
#   scripts/fuzz.sh [--seconds N] [--runs N] [TARGET...]
#     TARGET: openai_request safetensors tokenizer hf_tokenizer chat_template grammar
#             grpc_request
#             (default: all)
#     --seconds N: -max_total_time=N per target (default 20); --runs N: -runs=N instead
#     (both: whichever limit comes first)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build-fuzz
SHARED=${LLM_SHARED_DIR:-$ROOT/../shared}

seconds=""
runs=""
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(openai_request safetensors tokenizer hf_tokenizer chat_template grammar grpc_request)
fi

if [[ ! -f $BUILD/build.ninja ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DLLM_FUZZ=ON -DLLM_ENABLE_CUDA=OFF \
    -DLLM_BUILD_TESTS=OFF >/dev/null
fi
ninja -C "$BUILD" -j "$(nproc)" "${targets[@]/%/_fuzz}"

# Both given: whichever comes first. Neither: 20 seconds.
limit=()
[[ -n $runs ]] && limit+=(-runs="$runs")
[[ -n $seconds || -z $runs ]] && limit+=(-max_total_time="${seconds:-20}")

# fuzz_one TARGET: one libFuzzer run; writes its summary line to $BUILD/fuzz/TARGET/result and
# exits with libFuzzer's status. A libFuzzer process is single-threaded, so the targets run
# LLM_FUZZ_JOBS at a time (default: the cores), each for the same -max_total_time: on CI's two
# cores the 7 x 20 s took ~150 s one after another, ~85 s two at a time.
fuzz_one() {
  local t=$1
  local work=$BUILD/fuzz/$t
  rm -rf "$work/corpus" "$work/artifacts" "$work/result"  # a crash file left here is from this run only
  mkdir -p "$work/corpus" "$work/artifacts"
  cp "$ROOT/tests/fuzz/corpus/$t/"* "$work/corpus/"
  local extra=()
  # Field names and keywords the mutator would take long to guess.
  [[ -f $ROOT/tests/fuzz/$t.dict ]] && extra+=(-dict="$ROOT/tests/fuzz/$t.dict")
  case "$t" in
    # The real templates are seeds as they are (read-only second corpus: new inputs go to the first).
    chat_template) extra+=("$ROOT/tests/data/chat_templates") ;;
    # Mode byte 0 + the whole stories260K tokenizer.model: a valid model to mutate.
    tokenizer)
      if [[ -f $SHARED/models/stories260K/tokenizer.model ]]; then
        { printf '\0'; cat "$SHARED/models/stories260K/tokenizer.model"; } >"$work/corpus/model_full"
      fi ;;
  esac
  local log=$work/fuzz.log
  echo "== ${t}_fuzz: ${limit[*]} (log: $log)"
  local rc=0 start=$SECONDS
  LLM_SHARED_DIR=$SHARED "$BUILD/${t}_fuzz" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" "${extra[@]}" \
    >"$log" 2>&1 || rc=$?
  local execs secs corpus crashes line
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  secs=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corpus=$(find "$work/corpus" -type f | wc -l)
  crashes=$(grep -o 'Test unit written to .*' "$log" | sed 's/Test unit written to //' || true)
  line="$t: rc=$rc execs=${execs:-?} time=$((SECONDS - start))s execs/s=${secs:-?} corpus=$corpus"
  if [[ $rc -ne 0 ]]; then
    line+=" CRASH: ${crashes:-see $log}"
  else
    line+=" crashes=0"
  fi
  echo "$line" >"$work/result"
  return $rc
}

jobs=${LLM_FUZZ_JOBS:-$(nproc)}
running=0
for t in "${targets[@]}"; do
  if [[ $running -ge $jobs ]]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true

# The verdicts, in target order (a crash's log tail first).
status=0
summary=()
for t in "${targets[@]}"; do
  work=$BUILD/fuzz/$t
  line=$(cat "$work/result" 2>/dev/null || echo "$t: no result (log: $work/fuzz.log)")
  case "$line" in
    *" rc=0 "*) ;;
    *)
      status=1
      tail -n 40 "$work/fuzz.log" 2>/dev/null || true
      ;;
  esac
  echo "$line"
  summary+=("$line")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
