#!/usr/bin/env bash
# Checks that the project's C++ and CUDA sources are clang-formatted (.clang-format: Google
# style, 100 columns). Run by ctest (`clang_format`, so CI's unit stage enforces it) or by hand;
# `scripts/check_format.sh --fix` formats them in place.
# Files: every tracked *.cc / *.h / *.cu / *.cuh (all of them are project code: generated
# sources live in the build folders).
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
[ "${1:-}" = "--fix" ] && fix=1
if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is not installed (Debian: apt-get install clang-format;" \
       "scripts/deps.sh installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find engine server kernels tests bench clients \
    \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
fi
if [ $fix -eq 1 ]; then
  clang-format -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not clang-formatted:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "first differences:" >&2
  clang-format --dry-run "${bad[0]}" 2>&1 | head -20 >&2
  echo "fix: scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files clang-formatted ($(clang-format --version))"
