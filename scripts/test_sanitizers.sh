#!/usr/bin/env bash
# Sanitizer builds and runs (CPU only, CUDA off); CI runs it after the normal suite.
# Usage: scripts/test_sanitizers.sh [address|thread|all]   (default: all)
#
#   address  build-asan/: ASan + UBSan + LeakSanitizer, the whole CPU suite (ctest -L cpu),
#            including the tests that spawn build-asan/llm (CLI, `llm serve` with the node
#            and Python clients): those children are sanitized too.
#   thread   build-tsan/: ThreadSanitizer on the threaded code: engine_test (the soak: two
#            producer threads, cancellations and the engine thread), engine_step_failure_test
#            (failing steps under load, health listeners) and http_server_test (server
#            workers, streams, disconnects, drain). grpc_server_test is left out: see
#            run_thread. LLM_TSAN_TESTS='engine_test|http_server_test|grpc_server_test' runs
#            another set (a regex of test binaries).
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

# A test that fails only on a timing assertion is run again, up to twice: sanitized code is
# 5-20x slower and CI machines are shared, and a few server tests wait a fixed time for a
# request to start (seen here under TSan: http_server_test's DisconnectCancelsAndFreesBlocks
# and DrainingRefusesNewWorkAndFinishesOld). A sanitizer report still fails the run, from any
# attempt: check_reports reads every report file. The normal suite (scripts/test.sh) has no retry.
retry=(--repeat until-pass:3)

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
  local options=(
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:log_path=$logs/asan"
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan"
  )
  part "address: ctest -L cpu" env "${options[@]}" \
    ctest --test-dir "$dir" -L cpu -E '^server_soak$' "${retry[@]}" -j "$jobs" \
    --output-on-failure --timeout 600
  # The HTTP soak (ctest server_soak) on its own, with a looser RSS bound: ASan keeps freed
  # memory in its quarantine (256 MiB by default) and its allocator rarely returns memory, so
  # the server's RSS grows ~300 MiB over the soak whatever the code does; the 64 MiB bound of
  # the normal build would always fail. Leaks are LeakSanitizer's job here (at the server's
  # exit); 512 MiB still catches a runaway.
  part "address: server_soak" env "${options[@]}" tests/soak/run_server_soak.sh "$dir" \
    "${LLM_SHARED_DIR:-$root/../shared}" --max-rss-growth-mib 512
  part "address: sanitizer reports" check_reports "$dir"
}

# grpc_server_test is not in the TSan set. Debian's gRPC and abseil are not instrumented, and
# every step of our reactor's life crosses them: the pump thread starts a write or Finish
# (Call::PerformOps), libgrpc completes it on one of its threads, which runs OnWriteDone or, via
# libgrpc++'s executor, CallOnDone -> our OnDone, and Server::Wait in Stop() returns once those
# are done. TSan sees none of these handoffs, so each looks like a race: measured here, after
# the suppressions in tests/tsan.supp, reports still came from CallOnDone reading members set by
# the handler thread (gRPC's reactor_, our pump_), from Stop() deleting the grpc::Server that
# the pump thread's PerformOps had read, and from absl's Cord/Status. Suppressing CallOnDone and
# PerformOps as well would hide OnDone and every write start (a suppression matches a frame
# anywhere in either stack; OnWriteDone is already under CallbackWithSuccessTag::Run), leaving
# nothing of the reactor checked. The engine side of a gRPC stream (OutputChannel, cancel) is
# the same code http_server_test and engine_test run under TSan; the reactor's own lifetime
# (OnDone joins the pump thread, then deletes) is checked for use after free by the ASan stage.
TSAN_TESTS=${LLM_TSAN_TESTS:-engine_test|engine_async_test|engine_step_failure_test|http_server_test}
# Left out under TSan until the test is fixed (tests/server/http/http_server_test.cc): it expects
# the request to be running once the first response bytes arrive, but those are the server's
# probes, written while the request still waits for the (TSan-slowed) engine thread, so it
# failed on every attempt here (num_running 0). DisconnectDuringPrefillCancelsAndFreesBlocks
# still checks the disconnect path under TSan; the normal and ASan runs keep this test.
TSAN_EXCLUDE='^http_server_test\.HttpServerTest\.DisconnectCancelsAndFreesBlocks$'

run_thread() {
  local dir=build-tsan logs=$root/build-tsan/sanitizer-logs
  configure "$dir" thread
  local targets
  IFS='|' read -r -a targets <<<"$TSAN_TESTS"
  part "thread: build" cmake --build "$dir" -- -j "$jobs" "${targets[@]}"
  rm -rf "$logs" && mkdir -p "$logs"
  # OMP_NUM_THREADS=1: libgomp is not built with TSan, so its barriers and task handoffs are
  # invisible to it and every OpenMP-parallel kernel would be reported as a race between
  # the team's threads. With one thread a parallel region runs on the calling thread (no
  # team), so all reports concern our own threads: engine loop, producers, server workers.
  # The kernels' OpenMP splits are the ASan part's concern (bounds), not TSan's.
  part "thread: ctest" env OMP_NUM_THREADS=1 \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/tsan.supp:log_path=$logs/tsan" \
    ctest --test-dir "$dir" -R "^($TSAN_TESTS)\\." -E "$TSAN_EXCLUDE" \
    "${retry[@]}" \
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
