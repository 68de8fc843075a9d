#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan, in build-fuzz/) and runs each
# on a copy of its seed corpus, one after another. Exits non-zero on any crash, leak or
# timeout; the crash file's path is printed. Needs clang, libclang-rt-14-dev and libomp-dev
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
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
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

status=0
summary=()
for t in "${targets[@]}"; do
  work=$BUILD/fuzz/$t
  rm -rf "$work/corpus" "$work/artifacts"  # a crash file left here is from this run only
  mkdir -p "$work/corpus" "$work/artifacts"
  cp "$ROOT/tests/fuzz/corpus/$t/"* "$work/corpus/"
  extra=()
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
  log=$work/fuzz.log
  echo "== ${t}_fuzz: ${limit[*]} (log: $log)"
  rc=0
  start=$SECONDS
  LLM_SHARED_DIR=$SHARED "$BUILD/${t}_fuzz" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" "${extra[@]}" \
    >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  secs=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  corpus=$(find "$work/corpus" -type f | wc -l)
  crashes=$(grep -o 'Test unit written to .*' "$log" | sed 's/Test unit written to //' || true)
  line="$t: rc=$rc execs=${execs:-?} time=$((SECONDS - start))s execs/s=${secs:-?} corpus=$corpus"
  if [[ $rc -ne 0 ]]; then
    status=1
    tail -n 40 "$log"
    line+=" CRASH: ${crashes:-see $log}"
  else
    line+=" crashes=0"
  fi
  echo "$line"
  summary+=("$line")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
