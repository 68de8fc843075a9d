#!/usr/bin/env bash
# Installs the Debian 12 packages the build and the tests need (idempotent: apt-get runs only
# when something is missing). Run as root on a fresh machine.
# LLM_DEPS is a list of groups (default: test):
#   build      what building `llm` needs (container images)
#   test       build + the test-only packages (GoogleTest, Python, SentencePiece, node/npm,
#              Chromium, matplotlib)
#   fuzz       clang 14 with its sanitizer/libFuzzer runtimes and OpenMP (scripts/fuzz.sh)
#   container  rootful podman with runc and debootstrap (scripts/test_container.sh)
# e.g. LLM_DEPS="test fuzz container" scripts/deps.sh (what scripts/test.sh installs for CI).
set -euo pipefail
groups=${LLM_DEPS:-test}
packages=()
with_recommends=()
for g in $groups; do
  case "$g" in
    build | test)
      packages+=(
        build-essential cmake ninja-build pkg-config git ca-certificates
        libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcli11-dev
        libcpp-httplib-dev libboost-dev libgrpc++-dev protobuf-compiler-grpc
        libssl-dev   # `llm download`: HTTPS (cpp-httplib's OpenSSL support) and sha256 (EVP)
        libpcre2-dev libicu-dev libsimdjson-dev   # tokenizer.json: regexes, Unicode, parsing
      )
      ;;&
    test)
      packages+=(
        libgtest-dev libgmock-dev python3-grpcio python3-protobuf
        python3 python3-sentencepiece sentencepiece   # tokenizer oracle + spm_train (demo vocab)
        python3-venv python3-wheel curl   # the llm_client package installed in a venv; examples/curl.sh
        chromium              # the chat page's browser test (headless, driven by playwright-core)
        python3-matplotlib    # bench/plot_bench_serve.py (latency against load, bench_serve test)
        python3-munkres       # fonttools' alternative to scipy: keeps 45 MB of scipy/pythran out
        clang-format          # scripts/check_format.sh (the ctest clang_format)
      )
      # The openai npm package test needs node and npm (a base image may already have them).
      command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
      ;;
    fuzz)
      # clang is Debian 12's clang-14; libFuzzer and the sanitizer runtimes are in
      # libclang-rt-14-dev, only a Recommends of clang-14 (not installed below); clang's
      # -fopenmp needs LLVM's libomp (libomp-dev -> libomp-14-dev), not GCC's libgomp.
      packages+=(clang libclang-rt-14-dev libomp-dev)
      ;;
    container)
      # Installed with Recommends: podman's network stack (netavark, aardvark-dns) comes
      # that way, and `podman build` needs it for the RUN steps (../shared/CONTAINERS.md).
      # curl and the Python gRPC client check the running container.
      with_recommends+=(podman runc debootstrap curl)
      packages+=(protobuf-compiler protobuf-compiler-grpc python3-grpcio python3-protobuf)
      ;;
    build) ;;
    *)
      echo "[deps] LLM_DEPS groups are build, test, fuzz, container (got '$g')" >&2
      exit 2
      ;;
  esac
done

# missing PACKAGE...: prints the ones not installed.
missing() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t need < <(missing "${packages[@]}" | sort -u)
mapfile -t need_rec < <([ ${#with_recommends[@]} -eq 0 ] || missing "${with_recommends[@]}")
if [ ${#need[@]} -gt 0 ] || [ ${#need_rec[@]} -gt 0 ]; then
  echo "[deps] installing: ${need[*]} ${need_rec[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
  fi
  if [ ${#need_rec[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_rec[@]}"
  fi
fi
