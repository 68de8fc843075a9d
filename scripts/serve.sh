#!/usr/bin/env bash
# The main job. Today: builds `llm` (installing what it needs) and runs `llm generate` on the
# default model, the build's DEMO model (random weights: gibberish text) unless --model
# points at a real Hugging Face folder. Arguments pass through to `llm generate`, e.g.
#   scripts/serve.sh --model ../shared/models/stories260K --prompt "Once upon a time"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh llm demo_model >/dev/null
args=("$@")
has_prompt=0
for a in "$@"; do [ "$a" = "--prompt" ] && has_prompt=1; done
[ $has_prompt -eq 1 ] || args+=(--prompt "Once upon a time")
exec build/llm generate "${args[@]}"
