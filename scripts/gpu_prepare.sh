#!/usr/bin/env bash
# Prepares a fresh checkout for the GPU machine's calls (../shared/DEVICE.md), on the
# development machine, from the repo root: downloads the Debian 12 packages the GPU build needs
# into .debs/ (git-ignored) and copies ../shared's models into .shared/ (../shared does not
# travel; .shared is excluded locally through .git/info/exclude). Then carry both:
#   run(command=..., carry=[".debs", ".shared"])
# Idempotent: packages already in .debs/ and an existing .shared/ are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(googletest libgtest-dev libgmock-dev
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32
  protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libabsl20220623 libc-ares-dev libc-ares2 libre2-dev libre2-9
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libcpp-httplib0.11
  libbrotli-dev libbrotli1 libssl-dev libssl3 zlib1g-dev
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72
  libsimdjson-dev libsimdjson14)
mkdir -p .debs
missing=()
for p in "${packages[@]}"; do
  ls .debs/"${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  (cd .debs && apt-get download "${missing[@]}") 2>&1 | grep -v '^W:' || true
fi
# Boost.Beast and Asio are header-only, and libboost1.74-dev (9.5 MB, 160 MB of headers) would
# push the carried folders past the machine's 64 MiB: carry just the headers they include.
if [ ! -f .debs/boost-beast-headers.tar.xz ]; then
  [ -f /usr/include/boost/beast.hpp ] || { echo "gpu_prepare: install libboost1.74-dev first" >&2; exit 1; }
  printf '#include <boost/beast.hpp>\n#include <boost/asio.hpp>\n' |
    g++ -std=gnu++20 -DBOOST_BEAST_USE_STD_STRING_VIEW -DBOOST_ASIO_NO_DEPRECATED -M -x c++ - |
    tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u | sed 's|^/||' |
    tar -C / -cJf .debs/boost-beast-headers.tar.xz -T -
fi
if [ ! -d .shared/models ]; then
  mkdir -p .shared
  cp -r ../shared/models .shared/
fi
mkdir -p .git/info
grep -qx '/.shared/' .git/info/exclude 2>/dev/null || echo '/.shared/' >> .git/info/exclude
echo "gpu_prepare: $(ls .debs/*.deb | wc -l) packages in .debs, $(du -sh .shared | cut -f1) in .shared"
