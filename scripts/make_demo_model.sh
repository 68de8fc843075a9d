#!/usr/bin/env bash
# Makes the demo model deterministically (called by the `demo_model` build target):
#   a 1000-piece SentencePiece BPE vocabulary trained by Debian's spm_train on this
#   repository's own text, random weights (seed 0) of engine/configs/demo.json, and Zephyr's
#   chat template (so that /v1/chat/completions and the chat page work out of the box).
# Usage: make_demo_model.sh LLM_BINARY OUT_DIR
set -euo pipefail
llm=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
# The corpus: the repository's prose and code, in a fixed order.
(cd "$root" && ls *.md engine/*.h engine/*.cc engine/*/*.h engine/*/*.cc kernels/cpu/*.h kernels/cpu/*.cc server/*.cc \
   2>/dev/null | LC_ALL=C sort | xargs cat) > "$tmp/corpus.txt"
# Relative paths: spm_train records them in the model, which must not depend on $tmp.
(cd "$tmp" && spm_train --input=corpus.txt --model_prefix=tok --vocab_size=1000 \
  --model_type=bpe --byte_fallback=true --character_coverage=1.0 --split_digits=true \
  --normalization_rule_name=identity --remove_extra_whitespaces=false \
  --allow_whitespace_only_pieces=true --num_threads=1 --shuffle_input_sentence=false \
  --input_sentence_size=0 --max_sentence_length=100000 --minloglevel=2 >spm.log 2>&1) \
  || { cat "$tmp/spm.log"; exit 1; }
"$llm" make-model --config "$root/engine/configs/demo.json" --out "$out" --seed 0 \
  --dtype f32 --tokenizer "$tmp/tok.model" \
  --chat-template "$root/tests/data/chat_templates/zephyr-7b-beta.jinja" 2>/dev/null
echo "DEMO MODEL: random weights (seed 0) and a 1000-piece vocabulary trained on this repository's text; its output is gibberish by design. Use --model DIR for a real Hugging Face checkpoint." > "$out/NOTICE"
