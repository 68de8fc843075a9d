#!/usr/bin/env bash
# The test command (CI runs it through .ci/run on a clean clone): installs missing Debian
# packages, then runs these stages in order, prints each one's duration and a summary, and
# fails when any stage failed (a failed stage does not stop the later ones).
#
#   unit       build/ (Release) and every test with ctest; GPU tests (label `gpu`) skip with
#              a message when no GPU is present
#   asan       the whole CPU suite under ASan + UBSan + LeakSanitizer (build-asan/)
#   tsan       the engine's threading tests under ThreadSanitizer (build-tsan/)
#   fuzz       every libFuzzer target for LLM_FUZZ_SECONDS (default 20) on its seed corpus,
#              under ASan + UBSan (clang, build-fuzz/)
#   container  the CPU image built with podman and checked end to end (/health, a completion,
#              a gRPC stream); last, since it is the slowest and needs the others' nothing
#
# LLM_TEST_STAGES picks stages (default: all of them, as CI runs it), e.g. for a quick local
# run: LLM_TEST_STAGES=unit scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
all_stages="unit asan tsan fuzz container"
stages=${LLM_TEST_STAGES:-$all_stages}
for s in $stages; do
  case " $all_stages " in
    *" $s "*) ;;
    *)
      echo "[test] unknown stage '$s' (stages: $all_stages)" >&2
      exit 2
      ;;
  esac
done

# Several test processes share the cores: OpenMP threads that spin while waiting would
# starve each other (a 30 ms test took 50 s under ctest -j2); let them sleep instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# Each stage is one command or an && chain: it runs in an `||` context, where set -e is off.
stage_unit() {
  scripts/build.sh -j "$(nproc)" &&
    ctest --test-dir build --output-on-failure --timeout 900 -j "$(nproc)"
}
stage_asan() { scripts/test_sanitizers.sh address; }
stage_tsan() { scripts/test_sanitizers.sh thread; }
stage_fuzz() { scripts/fuzz.sh --seconds "${LLM_FUZZ_SECONDS:-20}"; }
stage_container() {
  # The preparation started beside the fuzz stage (below) must be done first: both use podman.
  if [ -n "${container_prep_pid:-}" ]; then
    wait "$container_prep_pid" || echo "[test] container preparation failed (the stage redoes it):"
    sed 's/^/[container prep] /' "$container_prep_log"
    container_prep_pid=""
  fi
  scripts/test_container.sh
}
stage_build_dir() {
  case "$1" in
    unit) echo build ;;
    asan) echo build-asan ;;
    tsan) echo build-tsan ;;
  esac
}

# One apt-get for every stage's packages (the container stage's own call then finds them).
deps="test"
case " $stages " in *" fuzz "*) deps+=" fuzz" ;; esac
case " $stages " in *" container "*) deps+=" container" ;; esac
start=$SECONDS
LLM_DEPS=$deps scripts/deps.sh
summary=("$(printf '%-10s ok      %5ds' deps $((SECONDS - start)))")

failed=0
failed_stages=""
container_prep_pid=""
container_prep_log=${TMPDIR:-/tmp}/llm-container-prep.$$.log
for s in $stages; do
  echo "[test] ===== stage $s"
  # The container stage's base image (debootstrap) and package layer are downloads and
  # unpacking, independent of the sources: made in the background while the fuzz stage
  # compiles and fuzzes (which has no timing assertions; only when container comes after it),
  # they cost the container stage nothing but waiting for them.
  if [ "$s" = fuzz ] && [[ " $stages " == *" fuzz "*"container "* ]]; then
    scripts/test_container.sh --prepare >"$container_prep_log" 2>&1 &
    container_prep_pid=$!
  fi
  start=$SECONDS
  rc=0
  stage_"$s" || rc=$?
  took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    line=$(printf '%-10s ok      %5ds' "$s" $took)
  else
    line=$(printf '%-10s FAILED  %5ds (exit %d)' "$s" $took $rc)
    failed=1
    failed_stages+=" $s"
  fi
  echo "[test] ===== stage $line"
  summary+=("$line")
done

# Why the ctest stages failed, at the end of the log (CI pages keep its head and tail).
for s in unit asan tsan; do
  case " ${failed_stages:-} " in
    *" $s "*) python3 scripts/ctest_failures.py "$(stage_build_dir "$s")" || true ;;
  esac
done

echo
echo "[test] summary (${SECONDS}s in all)"
for line in "${summary[@]}"; do echo "  $line"; done
exit $failed
