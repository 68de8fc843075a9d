#!/usr/bin/env bash
# Sanitizer builds and runs (CPU only, CUDA off); CI runs it after the normal suite.
# Usage: scripts/test_sanitizers.sh [address|thread|all]   (default: all)
#
#   address  build-asan/: ASan + UBSan + LeakSanitizer, the whole CPU suite (ctest -L cpu),
#            including the tests that spawn build-asan/llm (CLI, `llm serve` with the node
#            and Python clients): those children are sanitized too.
#   thread   build-tsan/: ThreadSanitizer on the threaded code: engine_test (the soak: two
#            producer threads, cancellations and the engine thread), http_server_test,
#            grpc_server_test.
#
# Every sanitized process (tests and the `llm` children they spawn) writes its reports to
# <build>/sanitizer-logs/<tool>.<pid>: a child's stderr often goes to a log nobody reads, so
# the script fails when any report file exists, whatever the test's own verdict was.
# The long tests run with LLM_TEST_SCALE=small (fewer requests/strings, same checks):
# sanitized code runs 5-20x slower.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=${1:-all}
case "$mode" in
  address | thread | all) ;;
  *)
    echo "usage: $0 [address|thread|all]" >&2
    exit 2
    ;;
esac
jobs=$(nproc)
summary=()
failed=0

# Several test processes share the cores: let idle OpenMP threads sleep (see scripts/test.sh).
export OMP_WAIT_POLICY=passive
export LLM_TEST_SCALE=small

# configure BUILD_DIR SANITIZER
configure() {
  if [ ! -f "$1/build.ninja" ]; then
    cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLLM_ENABLE_CUDA=OFF \
      -DLLM_SANITIZE="$2" ${LLM_CMAKE_ARGS:-} >/dev/null
  fi
}

# check_reports BUILD_DIR: prints every sanitizer report file; fails when there is one.
check_reports() {
  local logs=$1/sanitizer-logs
  local reports
  reports=$(find "$logs" -type f 2>/dev/null | sort)
  [ -z "$reports" ] && return 0
  for f in $reports; do
    echo "==== $f"
    cat "$f"
  done
  return 1
}

# part NAME COMMAND...: runs and times one step, records the result for the summary.
part() {
  local name=$1
  shift
  local start=$SECONDS rc=0
  echo "[sanitizers] $name"
  "$@" || rc=$?
  local took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    summary+=("$(printf '%-28s ok      %4ds' "$name" $took)")
  else
    summary+=("$(printf '%-28s FAILED  %4ds (exit %d)' "$name" $took $rc)")
    failed=1
  fi
  return 0
}

run_address() {
  local dir=build-asan logs=$root/build-asan/sanitizer-logs
  configure "$dir" address
  # The CPU tests, `llm` and the demo model (benchmarks and GPU tests are not needed).
  local targets=(llm demo_model)
  while read -r src; do
    targets+=("$(basename "$src" .cc)")
  done < <(find tests -name '*_test.cc' ! -name '*_gpu_test.cc' | sort)
  part "address: build" cmake --build "$dir" -- -j "$jobs" "${targets[@]}"
  # The openai npm package: reuse the normal build's copy (no second download).
  if [ -d build/npm-openai/node_modules/openai ] && [ ! -d "$dir/npm-openai" ]; then
    cp -r build/npm-openai "$dir/"
  fi
  rm -rf "$logs" && mkdir -p "$logs"
  # strict_string_checks: str* arguments must be NUL-terminated within their buffer.
  part "address: ctest -L cpu" env \
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:log_path=$logs/asan" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan" \
    ctest --test-dir "$dir" -L cpu -j "$jobs" --output-on-failure --timeout 600
  part "address: sanitizer reports" check_reports "$dir"
}

run_thread() {
  local dir=build-tsan logs=$root/build-tsan/sanitizer-logs
  configure "$dir" thread
  part "thread: build" cmake --build "$dir" -- -j "$jobs" engine_test http_server_test \
    grpc_server_test
  rm -rf "$logs" && mkdir -p "$logs"
  # OMP_NUM_THREADS=1: libgomp is not built with TSan, so its barriers and task handoffs are
  # invisible to it and every OpenMP-parallel kernel would be reported as a race between
  # the team's threads. With one thread a parallel region runs on the calling thread (no
  # team), so all reports concern our own threads: engine loop, producers, server workers.
  # The kernels' OpenMP splits are the ASan part's concern (bounds), not TSan's.
  part "thread: ctest" env OMP_NUM_THREADS=1 \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/tsan.supp:log_path=$logs/tsan" \
    ctest --test-dir "$dir" -R '^(engine_test|http_server_test|grpc_server_test)\.' \
    -j "$jobs" --output-on-failure --timeout 600
  part "thread: sanitizer reports" check_reports "$dir"
}

total_start=$SECONDS
if [ "$mode" = address ] || [ "$mode" = all ]; then run_address; fi
if [ "$mode" = thread ] || [ "$mode" = all ]; then run_thread; fi

echo
echo "[sanitizers] summary ($mode, $((SECONDS - total_start))s in all)"
for line in "${summary[@]}"; do echo "  $line"; done
exit $failed
