#!/usr/bin/env bash
# Prints the Debian/Ubuntu packages that own the shared libraries BINARY loads (ldd + dpkg -S),
# one a line: what a runtime image must install to run it. Libraries no package owns are
# listed on stderr and left out, and so are CUDA's and NCCL's whoever owns them: the CUDA
# runtime base image provides those (a stand-in copies them in unpackaged; NVIDIA's image has
# them as cuda-cudart-13-0, libcublas-13-0 and libnccl2, the latter two apt-mark held, and
# naming them to apt-get again could ask it to change a held package).
# Usage: runtime_packages.sh BINARY
set -euo pipefail
ldd "$1" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case "${lib##*/}" in
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnccl.so* | libnvJitLink.so* \
      | libnvrtc.so* | libcufft.so* | libcurand.so* | libcusparse.so* | libcusolver.so*)
      echo "[runtime_packages] $lib: from the CUDA base image" >&2
      continue
      ;;
  esac
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
