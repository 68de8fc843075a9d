#!/usr/bin/env python3
"""Reference logits and greedy tokens from Hugging Face transformers (the independent oracle).

Runs where torch + transformers + sentencepiece are installed (the GPU machine; see
../shared/DEVICE.md). Writes tests/data/stories260k_reference.json, which
tests/engine/cpu/model_reference_test.cc compares our CPU model against:

  python3 tests/tools/make_hf_reference.py --model ../shared/models/stories260K \
      --out tests/data/stories260k_reference.json

Contents: the prompt's token ids (SentencePiece + BOS, as tokenizer_config.json says), HF's
greedy continuation (64 new tokens, fp32, do_sample=False), and the fp32 logits of every
position of prompt + continuation from one forward pass.
"""
import argparse
import json
import os

import sentencepiece as spm
import torch
import transformers
from transformers import LlamaForCausalLM

PROMPTS = ["Once upon a time", "The little dog ran to the park and"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()

    torch.manual_seed(0)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.model, "tokenizer.model"))
    model = LlamaForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    model.eval()
    cases = []
    for prompt in PROMPTS:
        ids = [sp.bos_id()] + sp.encode(prompt)
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens,
                                 do_sample=False, num_beams=1, eos_token_id=None,
                                 pad_token_id=0)
            full = gen[0].tolist()
            logits = model(torch.tensor([full])).logits[0].float()
        cases.append({
            "prompt": prompt,
            "prompt_ids": ids,
            "greedy_ids": full[len(ids):],
            "greedy_text": sp.decode(full[len(ids):]),
            "logits": [[float("%.7g" % v) for v in row] for row in logits.tolist()],
        })
    ref = {
        "made_by": "tests/tools/make_hf_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "note": "greedy_ids: HF generate(do_sample=False) without stopping at EOS; logits: "
                "one forward over prompt_ids + greedy_ids, shape [len, vocab]",
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    for c in cases:
        print(c["prompt"], "->", repr(c["greedy_text"][:120]))


if __name__ == "__main__":
    main()
