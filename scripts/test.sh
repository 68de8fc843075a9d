#!/usr/bin/env bash
# The test command: installs missing Debian packages, configures, builds, runs every test.
# GPU tests (ctest label `gpu`) skip with a message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 -j "$(nproc)"
