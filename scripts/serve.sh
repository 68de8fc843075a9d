#!/usr/bin/env bash
# The main job: builds `llm` (installing what it needs) and starts the OpenAI-compatible
# server on the default model, the build's DEMO model (random weights: gibberish text), unless
# --model points at a real Hugging Face folder. Arguments pass through to `llm serve`, e.g.
#   scripts/serve.sh --model ../shared/models/stories260K --port 8000
#   curl localhost:8000/v1/completions -d '{"prompt": "Once upon a time", "max_tokens": 40}'
# SIGTERM / Ctrl-C drains in-flight requests and exits 0 (a second one exits at once).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh llm demo_model >/dev/null
exec build/llm serve "$@"
