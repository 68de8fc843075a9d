#!/usr/bin/env python3
"""Summarises scripts/gpu_e2e_bench.sh's runs: JSON for bench/results/e2e-h200.json and a
markdown table with each figure's ratio to its ceiling measured in the same call.

  python3 bench/e2e_report.py --runs e2e-runs.jsonl --ceilings ceilings.txt \
      --json e2e-h200.json --md e2e-summary.md

Ceilings: copy bandwidth (bench_copy_bandwidth_gpu, read + write bytes per second) and the
cuBLASLt GEMM rate (bench_gemm_peak_gpu, the 8192^3 square GEMM: bf16, or for runs with
--quantization fp8 the fp8 fast-accumulation rate, what those runs' GEMMs use).
  batch-1 decode roofline  = weight bytes streamed per token / copy bandwidth
  TTFT compute floor       = (2 * linear params * L + 2 * L^2 * heads * head_dim * layers
                              [causal QK^T and PV]) / GEMM rate (an fp8 run's linear
                              layers at the fp8 rate, its attention at the bf16 rate)
  decode memory floor      = decode_bytes_read (llm bench: weight bytes per token once per
                              decode-only step + the KV bytes of every key those steps'
                              sequences attend to) / copy bandwidth, against those steps'
                              CUDA-event time decode_device_ms (target >= 0.85)
Throughput runs of a Llama-3-8B-shaped model with --quantization fp8 and uniform lengths that
TensorRT-LLM publishes (its perf overview, trtllm-bench, Llama-3.1-8B FP8, one GPU, H100 SXM and
H200 SXM columns) are put against that figure for the run's GPU (issue 29: >= 1.05). Its runs
used 30,000 / 3,000 / 1,500 requests at 128 / 128, 1,000 / 1,000 and 2,048 / 2,048, more than
gpu_e2e_bench.sh's defaults (8,192 / 1,000 / 1,000; E2E_REQUESTS* raise them).
"""
import argparse
import datetime
import json


# TensorRT-LLM's published output tok/s for nvidia/Llama-3.1-8B-Instruct-FP8 on one GPU, by
# (input, output) length (docs/source/performance/perf-overview.md, v1.0-era table).
TRTLLM_LLAMA31_8B_FP8 = {
    "H200": {(128, 128): 27911, (128, 2048): 26221, (128, 4096): 18027, (500, 2000): 20770,
             (1000, 1000): 17744, (1000, 2000): 16828, (2048, 128): 3538, (2048, 2048): 12194,
             (5000, 500): 3902, (20000, 2000): 1804},
    "H100": {(128, 128): 28312, (128, 2048): 22714, (128, 4096): 14325, (500, 2000): 17660,
             (1000, 1000): 15220, (1000, 2000): 13899, (2048, 128): 3450, (2048, 2048): 9305,
             (5000, 500): 3459, (20000, 2000): 1351},
}


def trtllm_reference(res, cfg, device):
    """TensorRT-LLM's published figure for this run's shape and GPU, or None."""
    if res.get("quantization") != "fp8" or not cfg or not res.get("requests"):
        return None
    llama3_8b = (cfg.get("hidden_size"), cfg.get("num_hidden_layers"),
                 cfg.get("intermediate_size"), cfg.get("vocab_size")) == (4096, 32, 14336, 128256)
    gpu = "H200" if "H200" in device else "H100" if "H100" in device else None
    n = res["requests"]
    if not llama3_8b or gpu is None or res["prompt_tokens"] % n or res["generated_tokens"] % n:
        return None
    shape = (res["prompt_tokens"] // n, res["generated_tokens"] // n)
    ref = TRTLLM_LLAMA31_8B_FP8[gpu].get(shape)
    return (gpu, shape, ref) if ref else None


def load_config(path):
    try:
        return json.load(open(path))
    except OSError:
        return None


def linear_params(c):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    d = c.get("head_dim") or h // heads
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i
    return c["num_hidden_layers"] * per_layer + v * h


def decode_floor(res, copy_tbs):
    """The decode-only steps' memory floor and their time's ratio to it (None without them)."""
    bytes_read, ms = res.get("decode_bytes_read"), res.get("decode_device_ms")
    if bytes_read is None or not ms or not copy_tbs:
        return None, None
    floor = bytes_read / (copy_tbs * 1e12) * 1e3
    return floor, floor / ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--ceilings", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    a = ap.parse_args()
    copy_tbs, gemm_tflops, gemm_fp8_tflops, device = None, None, None, ""
    for line in open(a.ceilings):
        if not line.startswith("JSON "):
            continue
        j = json.loads(line[5:])
        if j.get("kind") == "copy":
            copy_tbs = j.get("tb_per_s")
            device = j.get("device", device)
        if j.get("kind") == "gemm" and j.get("name") == "square":
            gemm_tflops = j["tflops"]
            device = j.get("device", device)
        if j.get("kind") == "gemm" and j.get("name") == "square_fp8_fast":
            gemm_fp8_tflops = j["tflops"]
    runs = [json.loads(l) for l in open(a.runs) if l.strip()]
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
           "device": device, "command": "E2E_PHASE=bench bash scripts/gpu_e2e_bench.sh",
           "ceilings": {"copy_tb_per_s": copy_tbs, "gemm_bf16_tflops": gemm_tflops,
                        "gemm_fp8_fast_tflops": gemm_fp8_tflops},
           "runs": {}}
    rows = []
    for r in runs:
        name = r["name"]
        if "error" in r:
            out["runs"][name] = r
            rows.append((name, "FAILED: " + r["error"], "", ""))
            continue
        res = r["result"]
        entry = {"bench": res}
        cfg = load_config(res.get("model", ""))
        num_rows = len(rows)
        if name.startswith("latency"):
            tpot = res["tpot_ms_mean"]
            roof = res["weight_bytes_per_token"] / (copy_tbs * 1e12) * 1e3 if copy_tbs else None
            entry.update(ms_per_token=tpot, roofline_ms=roof,
                         ratio_to_roofline=roof / tpot if roof else None, target_ratio=0.85)
            rows.append((name, f"{tpot:.3f} ms/token", f"roofline {roof:.3f} ms" if roof else "",
                         f"{roof / tpot:.2f} of roofline (target 0.85)" if roof else ""))
        elif name.startswith("ttft"):
            ttft = res["ttft_ms_p50"]
            floor = None
            if cfg and gemm_tflops:
                L = res["prompt_tokens"] / res["requests"]
                d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
                attn = 2 * L * L * cfg["num_attention_heads"] * d * cfg["num_hidden_layers"]
                if res.get("quantization") == "fp8" and gemm_fp8_tflops:
                    head = 2 * cfg["vocab_size"] * cfg["hidden_size"] * L  # lm_head stays bf16
                    layers = 2 * linear_params(cfg) * L - head
                    floor = (layers / (gemm_fp8_tflops * 1e12) +
                             (head + attn) / (gemm_tflops * 1e12)) * 1e3
                else:
                    floor = (2 * linear_params(cfg) * L + attn) / (gemm_tflops * 1e12) * 1e3
            entry.update(ttft_ms=ttft, compute_floor_ms=floor,
                         ratio_to_floor=floor / ttft if floor else None)
            rows.append((name, f"{ttft:.1f} ms TTFT (p50)",
                         f"floor {floor:.1f} ms" if floor else "",
                         f"{floor / ttft:.2f} of floor" if floor else ""))
        elif name.startswith("throughput"):
            tps = res["generated_tokens_per_s"]
            entry.update(output_tokens_per_s=tps, gpu_busy_fraction=res.get("gpu_busy_fraction"))
            ref = trtllm_reference(res, cfg, device)
            if ref:
                gpu, (isl, osl), figure = ref
                entry.update(trtllm_output_tokens_per_s=figure, ratio_to_trtllm=tps / figure,
                             target_ratio_to_trtllm=1.05)
                versus = (f"{tps / figure:.3f} of TensorRT-LLM's {figure:,} ({gpu}, {isl} / {osl}; "
                          "target 1.05)")
            else:
                versus = "no published figure for this shape"
            rows.append((name, f"{tps:,.0f} output tok/s", f"{res['requests']} requests, "
                         f"{res['seconds']:.0f} s",
                         f"{versus}; busy {res.get('gpu_busy_fraction', 0):.2f}"))
        elif name.startswith("decode"):
            busy = res.get("gpu_busy_fraction")
            entry.update(gpu_busy_fraction=busy, output_tokens_per_s=res["generated_tokens_per_s"])
            rows.append((name, f"busy {busy:.3f}", f"{res['generated_tokens_per_s']:,.0f} tok/s",
                         "target busy >= 0.90"))
        elif name.startswith("long"):
            gib = 1 << 30
            entry.update(ttft_ms=res["ttft_ms_p50"], decode_ms_per_token=res["tpot_ms_mean"],
                         peak_device_gib=res.get("peak_device_bytes", 0) / gib,
                         kv_cache_gib=res.get("kv_cache_bytes", 0) / gib)
            rows.append((name, f"TTFT {res['ttft_ms_p50'] / 1e3:.2f} s, "
                         f"{res['tpot_ms_mean']:.2f} ms/token at 128k",
                         f"peak {res.get('peak_device_bytes', 0) / gib:.1f} GiB",
                         f"KV pool {res.get('kv_cache_gib', res.get('kv_cache_bytes', 0) / gib):.1f} GiB"))
        if name.startswith("throughput") or "decode_bytes_read" in res:
            floor, ratio = decode_floor(res, copy_tbs)
            entry.update(decode_floor_ms=floor, ratio_to_decode_floor=ratio,
                         decode_batch_mean=res.get("decode_batch_mean"),
                         target_decode_floor_ratio=0.85)
            if ratio is not None:
                text = (f"decode steps at {ratio:.2f} of their memory floor (weights + KV at "
                        f"copy speed), mean batch {res.get('decode_batch_mean', 0):.1f} "
                        "(target 0.85)")
                if len(rows) == num_rows:  # a run of no kind above: a row of its own
                    rows.append((name, f"{res['decode_step_ms_mean']:.3f} ms/decode step",
                                 f"floor {floor / res['decode_steps']:.3f} ms", text))
                else:
                    rows[-1] = rows[-1][:3] + (rows[-1][3] + "; " + text,)
        out["runs"][name] = entry
    json.dump(out, open(a.json, "w"), indent=1)
    with open(a.md, "w") as f:
        f.write(f"E2E on {device}, {out['date']}; copy {copy_tbs} TB/s, "
                f"cuBLASLt bf16 {gemm_tflops} TFLOP/s\n\n")
        f.write("| run | result | reference | ratio |\n|---|---|---|---|\n")
        for row in rows:
            f.write("| " + " | ".join(row) + " |\n")


if __name__ == "__main__":
    main()
