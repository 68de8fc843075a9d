#!/usr/bin/env bash
# Prints the Debian/Ubuntu packages that own the shared libraries BINARY loads (ldd + dpkg -S),
# one a line: what a runtime image must install to run it. Libraries no package owns (for
# example CUDA's, from a base image) are listed on stderr and left out.
# Usage: runtime_packages.sh BINARY
set -euo pipefail
ldd "$1" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  real=$(readlink -f "$lib")
  # usrmerge: dpkg may know the file under /lib or /usr/lib, by its link name or real name.
  for candidate in "$lib" "$real" "${lib#/usr}" "/usr$lib" "${real#/usr}" "/usr$real"; do
    if owner=$(dpkg -S "$candidate" 2>/dev/null); then
      echo "${owner%%:*}"   # "libfoo1:amd64: /usr/lib/..." -> libfoo1
      continue 2
    fi
  done
  echo "[runtime_packages] no package owns $lib" >&2
done | sort -u
