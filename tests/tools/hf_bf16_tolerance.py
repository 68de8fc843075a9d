#!/usr/bin/env python3
"""How far Hugging Face transformers' own bf16 / fp16 logits sit from its fp32 logits.

The CUDA backend's test (tests/engine/cuda/cuda_executor_gpu_test.cc) accepts GPU-vs-CPU logit
differences up to a small multiple of what transformers itself shows between half precision
and fp32 for the same model and tokens: the tolerance is measured, not guessed. Run on the GPU
machine (torch + transformers there):

  python3 tests/tools/hf_bf16_tolerance.py --model stories260K=../shared/models/stories260K \
      --model hd128=/tmp/tiny_hd128 --model hd64=/tmp/tiny_hd64 \
      --out tests/data/hf_half_precision_tolerance.json

Tokens: BOS + the first case's prompt ids and greedy continuation of
tests/data/stories260k_reference.json (ids < 512, valid for every model here). For each model and
half dtype: max |logit_half - logit_fp32| over every position and vocabulary entry, the largest
|logit_fp32|, and their ratio.
"""
import argparse
import json
import os

import torch
import transformers
from transformers import LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True, help="name=folder")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    ref = json.load(open(os.path.join(here, "..", "data", "stories260k_reference.json")))
    ids = ref["cases"][0]["prompt_ids"] + ref["cases"][0]["greedy_ids"]
    result = {
        "made_by": "tests/tools/hf_bf16_tolerance.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "num_tokens": len(ids),
        "models": {},
    }
    tokens = torch.tensor([ids], device="cuda")
    for spec in args.model:
        name, folder = spec.split("=", 1)
        fp32 = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).cuda().eval()
        with torch.no_grad():
            want = fp32(tokens).logits[0].float()
        entry = {}
        for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            half = LlamaForCausalLM.from_pretrained(folder, torch_dtype=dtype).cuda().eval()
            with torch.no_grad():
                got = half(tokens).logits[0].float()
            diff = (got - want).abs().max().item()
            scale = want.abs().max().item()
            entry[dtype_name] = {"max_abs_diff": diff, "max_abs_logit": scale,
                                 "relative": diff / scale}
            del half
        result["models"][name] = entry
        print(name, json.dumps(entry))
        del fp32
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
