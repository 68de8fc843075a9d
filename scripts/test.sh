#!/usr/bin/env bash
# The test command: installs missing Debian packages, configures, builds, runs every test.
# GPU tests (ctest label `gpu`) skip with a message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
cd build
# Several test processes share the cores: OpenMP threads that spin while waiting would
# starve each other (a 30 ms test took 50 s under ctest -j2); let them sleep instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --output-on-failure --timeout 900 -j "$(nproc)"
