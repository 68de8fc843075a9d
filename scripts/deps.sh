#!/usr/bin/env bash
# Installs the Debian 12 packages the build and the tests need (idempotent: apt-get runs only
# when something is missing). Run as root on a fresh machine.
# LLM_DEPS=build installs only what building `llm` needs (container images); the default,
# LLM_DEPS=test, adds the test-only packages (GoogleTest, Python, SentencePiece, node/npm,
# Chromium, matplotlib).
set -euo pipefail
level=${LLM_DEPS:-test}
case "$level" in build|test) ;; *) echo "[deps] LLM_DEPS must be build or test" >&2; exit 2;; esac
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcli11-dev
  libcpp-httplib-dev libgrpc++-dev protobuf-compiler-grpc
  libssl-dev   # `llm download`: HTTPS (cpp-httplib's OpenSSL support) and sha256 (EVP)
)
if [ "$level" = test ]; then
  packages+=(
    libgtest-dev libgmock-dev python3-grpcio python3-protobuf
    python3 python3-sentencepiece sentencepiece   # tokenizer oracle + spm_train (demo vocab)
    python3-venv python3-wheel curl   # the llm_client package installed in a venv; examples/curl.sh
    chromium              # the chat page's browser test (headless, driven by playwright-core)
    python3-matplotlib    # bench/plot_bench_serve.py (latency against load, bench_serve test)
    python3-munkres       # fonttools' alternative to scipy: keeps 45 MB of scipy/pythran out
  )
  # The openai npm package test needs node and npm (a base image may already have them).
  command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
