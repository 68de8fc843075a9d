#!/usr/bin/env python3
"""Collects the GPU attention benchmark lines into attention-h200.json, a plot and a table.

  python3 bench/attention_report.py --out-dir DIR [--gpu NAME] [--command CMD] LOG [LOG...]

Reads every line that starts with `JSON ` (one JSON object each) from the logs:
  kind "copy"    copy bandwidth (ours: build/bench_copy_bandwidth_gpu; torch: variant torch_copy)
  kind "decode"  batch, context, num_heads, num_kv_heads, head_dim, ms, tb_per_s, ...
  kind "prefill" batch, seq_len, num_heads, head_dim, causal, ms, tflops, ...
Decode lines with "kv" other than "bf16" (bench_decode_attention_gpu's fp8 KV cache) are kept
out of the bf16 tables, ratios and plot: listed as-is under "decode_fp8" (their failures are
still reported). Lines without "kv" are bf16.
Variants named torch_* are the baselines; every other variant is ours. Lines with an "error"
key, or ok/pass false, or no usable time, are listed as failures and left out of the ratios.
Also reads `STEP {...}` lines (written by scripts/gpu_attention_bench.sh: one per step with
its exit status) and `torch_env` lines. Unparseable lines are counted, never fatal.

Writes DIR/attention-h200.json and DIR/attention-h200.png (skipped with a message when
matplotlib is missing) and prints a markdown table (also written with --table FILE).
"""
import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys

BASELINES = ("torch_fa2", "torch_cudnn")
BF16 = 2


def num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def as_int(x):
    v = num(x)
    return int(v) if v is not None else None


def as_bool(x, default):
    if isinstance(x, bool):
        return x
    if isinstance(x, (int, float)):
        return bool(x)
    if isinstance(x, str):
        return x.strip().lower() in ("1", "true", "yes", "on")
    return default


_BAD_TOKENS = re.compile(r'(?<![\w"])(-?nan|-?inf(inity)?|NaN|-?Infinity)(?![\w"])', re.IGNORECASE)


def parse_obj(text):
    try:
        obj = json.loads(text)
    except ValueError:
        # C printf writes nan/inf, which is not JSON: make them null and retry.
        obj = json.loads(_BAD_TOKENS.sub("null", text))
        if isinstance(obj, dict):
            obj["_nonfinite"] = True
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def read_logs(paths):
    records, steps, envs, bad = [], [], [], []
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except OSError as e:
            bad.append(f"{path}: {e}")
            continue
        for n, line in enumerate(lines, 1):
            s = line.strip()
            for tag, sink in (("JSON ", records), ("STEP ", steps)):
                if s.startswith(tag):
                    try:
                        obj = parse_obj(s[len(tag):].strip())
                    except ValueError as e:
                        bad.append(f"{os.path.basename(path)}:{n}: {e}: {s[:160]}")
                        break
                    obj["_source"] = f"{os.path.basename(path)}:{n}"
                    if tag == "JSON " and obj.get("kind") == "torch_env":
                        envs.append(obj)
                    else:
                        sink.append(obj)
                    break
    return records, steps, envs, bad


def failure_reason(r):
    if r.get("error"):
        return str(r["error"])
    if r.get("_nonfinite") and "max_err" in r and r["max_err"] is None:
        return "max_err is nan/inf"
    if isinstance(r.get("max_err"), float) and not math.isfinite(r["max_err"]):
        return "max_err is nan/inf"
    for k in ("ok", "pass", "passed", "valid"):
        if k in r and not as_bool(r[k], True):
            return f"{k}=false"
    return None


def prefill_key(r):
    B, L, H, d = as_int(r.get("batch")), as_int(r.get("seq_len")), as_int(r.get("num_heads")), \
        as_int(r.get("head_dim"))
    if L is None or d is None:
        return None
    causal = as_bool(r.get("causal"), True)  # rows without the field (older logs) are causal
    return (B, L, H, d, causal)


def decode_key(r):
    B, L = as_int(r.get("batch")), as_int(r.get("context"))
    H, K, d = as_int(r.get("num_heads")), as_int(r.get("num_kv_heads")), as_int(r.get("head_dim"))
    if B is None or L is None:
        return None
    return (B, L, H, K, d)


def fill_prefill(r):
    ms = num(r.get("ms"))
    t = num(r.get("tflops"))
    if t is None and ms and ms > 0:
        B, L, H, d, causal = prefill_key(r)
        if None not in (B, L, H, d):
            t = 4.0 * B * H * L * L * d * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12
            r["tflops_computed_here"] = True
    r["tflops"] = t
    return t


def fill_decode(r):
    ms = num(r.get("ms"))
    t = num(r.get("tb_per_s"))
    # Ours from bench_decode_attention_gpu v3 on: also timed as launches captured in a CUDA
    # graph (graph_pdl_us / graph_us), which is how the torch baselines are timed
    # (attention_torch.py's "ms" is the graph time); the ratios use it, like for like.
    graph_us = num(r.get("graph_pdl_us")) or num(r.get("graph_us"))
    if not r.get("variant", "").startswith("torch") and graph_us and graph_us > 0:
        r["ms_per_launch"], r["tb_per_s_per_launch"] = ms, t
        ms, t = graph_us / 1000.0, None
        r["ms"], r["timing"] = ms, "graph"
    if t is None and ms and ms > 0:
        B, L, _H, K, d = decode_key(r)
        if None not in (B, L, K, d):
            t = 2.0 * B * L * K * d * BF16 / (ms * 1e-3) / 1e12
            r["tb_per_s_computed_here"] = True
    r["tb_per_s"] = t
    return t


def ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def public(r):
    return {k: v for k, v in r.items() if not k.startswith("_")}


def gpu_name(arg, records, envs):
    if arg:
        return arg
    for e in envs:
        if e.get("gpu"):
            return e["gpu"]
    for r in records:
        if r.get("device"):
            return str(r["device"])
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def build(records):
    copies = {"ours": [], "torch": []}
    prefill, decode, failures, ignored = {}, {}, [], 0
    for r in records:
        kind = r.get("kind")
        variant = str(r.get("variant") or ("unknown" if kind != "copy" else "cudaMemcpy_d2d"))
        why = failure_reason(r)
        if kind == "copy":
            t = num(r.get("tb_per_s"))
            if why or t is None:
                failures.append({"kind": "copy", "variant": variant, "error": why or "no tb_per_s",
                                 "source": r.get("_source")})
            else:
                copies["torch" if variant.startswith("torch") else "ours"].append(t)
            continue
        if kind not in ("prefill", "decode"):
            ignored += 1
            continue
        key = prefill_key(r) if kind == "prefill" else decode_key(r)
        if key is None:
            failures.append({"kind": kind, "variant": variant, "error": "shape keys missing",
                             "source": r.get("_source")})
            continue
        table = prefill if kind == "prefill" else decode
        entry = table.setdefault(key, {"variants": {}, "failures": [], "profiling": {}})
        value = fill_prefill(r) if kind == "prefill" else fill_decode(r)
        if as_bool(r.get("profiling"), False):
            # An ablation that gives wrong output on purpose (e.g. v4 without exp2, loads
            # alone): kept for the record, never "ours" and never a failure.
            entry["profiling"][variant] = public(r)
            continue
        if why or value is None or value <= 0:
            f = {"variant": variant, "error": why or "no usable time", "source": r.get("_source")}
            entry["failures"].append(f)
            failures.append({"kind": kind, "shape": list(key), **f})
            continue
        best = entry["variants"].get(variant)
        rec = public(r)
        rec["_value"] = value
        if best is None or value > best["_value"]:
            rec["runs_seen"] = (best or {}).get("runs_seen", 0) + 1
            entry["variants"][variant] = rec
        else:
            best["runs_seen"] = best.get("runs_seen", 1) + 1
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    copy_ours, copy_torch = med(copies["ours"]), med(copies["torch"])
    copy_bw = copy_ours or copy_torch
    if copy_bw is None:  # fall back to what the decode benches measured themselves
        got = [num(v.get("copy_tb_per_s")) for e in decode.values() for v in e["variants"].values()]
        copy_bw = med([g for g in got if g])
    return prefill, decode, failures, ignored, {"ours_cudaMemcpy": copy_ours,
                                                "torch_copy": copy_torch, "used": copy_bw}


def summarize(key, entry, kind, copy_bw):
    vs = entry["variants"]
    ours = {k: v for k, v in vs.items() if k not in BASELINES and not k.startswith("torch")}
    best_name = max(ours, key=lambda k: ours[k]["_value"]) if ours else None
    best = ours[best_name]["_value"] if best_name else None
    fa2 = vs["torch_fa2"]["_value"] if "torch_fa2" in vs else None
    cud = vs["torch_cudnn"]["_value"] if "torch_cudnn" in vs else None
    unit = "tflops" if kind == "prefill" else "tb_per_s"
    clean = lambda r: {k: v for k, v in r.items() if k != "_value"}  # noqa: E731
    if kind == "prefill":
        B, L, H, d, causal = key
        shape = {"batch": B, "seq_len": L, "num_heads": H, "head_dim": d, "causal": causal}
    else:
        B, L, H, K, d = key
        shape = {"batch": B, "context": L, "num_heads": H, "num_kv_heads": K, "head_dim": d}
    out = {**shape, "unit": unit,
           "ours_best": ({"variant": best_name, unit: best, "ms": num(ours[best_name].get("ms")),
                          "max_err": ours[best_name].get("max_err")} if best_name else None),
           "ours": {k: clean(v) for k, v in sorted(ours.items())},
           "torch_fa2": clean(vs["torch_fa2"]) if "torch_fa2" in vs else None,
           "torch_cudnn": clean(vs["torch_cudnn"]) if "torch_cudnn" in vs else None,
           "ratio_ours_to_fa2": ratio(best, fa2), "ratio_ours_to_cudnn": ratio(best, cud),
           "failures": entry["failures"]}
    if entry.get("profiling"):
        out["profiling"] = dict(sorted(entry["profiling"].items()))
    if kind == "decode":
        # Above the copy ceiling means the timing or the byte count is off (e.g. L2 reuse).
        out["suspect_over_copy"] = sorted(
            k for k, v in vs.items() if copy_bw and v["_value"] > 1.1 * copy_bw)
        out["copy_tb_per_s"] = copy_bw
        out["ratio_ours_to_copy"] = ratio(best, copy_bw)
        out["ratio_fa2_to_copy"] = ratio(fa2, copy_bw)
        out["ratio_cudnn_to_copy"] = ratio(cud, copy_bw)
    return out


def fmt(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


def fail_note(entry, who):
    for f in entry["failures"]:
        if (who == "ours" and not str(f["variant"]).startswith("torch")) or f["variant"] == who:
            return "err"
    return "—"


def table(prefill_rows, decode_rows, copy, prefill, decode):
    out, notes = [], []
    out.append(f"copy bandwidth (read+write): ours cudaMemcpy {fmt(copy['ours_cudaMemcpy'], 2)} TB/s, "
               f"torch copy_ {fmt(copy['torch_copy'], 2)} TB/s")
    out.append("")
    out.append("prefill, bf16, TFLOP/s (ours = best variant)")
    out.append("| hd | causal | B×L | ours | variant | FA2 | cuDNN | ours/FA2 | ours/cuDNN |")
    out.append("|---:|:---:|---:|---:|:---|---:|---:|---:|---:|")
    for r, key in prefill_rows:
        e = prefill[key]
        ob = r["ours_best"]
        v = lambda x: x["tflops"] if x else None  # noqa: E731
        out.append(f"| {r['head_dim']} | {'y' if r['causal'] else 'n'} | {r['batch']}×{r['seq_len']} | "
                   f"{fmt(ob['tflops']) if ob else fail_note(e, 'ours')} | {ob['variant'] if ob else ''} | "
                   f"{fmt(v(r['torch_fa2'])) if r['torch_fa2'] else fail_note(e, 'torch_fa2')} | "
                   f"{fmt(v(r['torch_cudnn'])) if r['torch_cudnn'] else fail_note(e, 'torch_cudnn')} | "
                   f"{fmt(r['ratio_ours_to_fa2'], 2)} | {fmt(r['ratio_ours_to_cudnn'], 2)} |")
    out.append("")
    out.append(f"decode, bf16, TB/s of K+V read, CUDA-graph timed where the bench gives it "
               f"(copy ceiling {fmt(copy['used'], 2)} TB/s)")
    out.append("| B×ctx | heads q/kv | ours | variant | FA2 | cuDNN | ours/copy | FA2/copy | cuDNN/copy | ours/FA2 | ours/cuDNN |")
    out.append("|---:|:---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|")
    for r, key in decode_rows:
        e = decode[key]
        ob = r["ours_best"]
        v = lambda x: x["tb_per_s"] if x else None  # noqa: E731
        if r.get("suspect_over_copy"):
            notes.append(f"decode {r['batch']}x{r['context']}: over the copy ceiling: "
                         + ", ".join(r["suspect_over_copy"]))
        out.append(f"| {r['batch']}×{r['context']} | {r['num_heads']}/{r['num_kv_heads']} | "
                   f"{fmt(ob['tb_per_s'], 2) if ob else fail_note(e, 'ours')} | {ob['variant'] if ob else ''} | "
                   f"{fmt(v(r['torch_fa2']), 2) if r['torch_fa2'] else fail_note(e, 'torch_fa2')} | "
                   f"{fmt(v(r['torch_cudnn']), 2) if r['torch_cudnn'] else fail_note(e, 'torch_cudnn')} | "
                   f"{fmt(r['ratio_ours_to_copy'], 2)} | {fmt(r['ratio_fa2_to_copy'], 2)} | "
                   f"{fmt(r['ratio_cudnn_to_copy'], 2)} | {fmt(r['ratio_ours_to_fa2'], 2)} | "
                   f"{fmt(r['ratio_ours_to_cudnn'], 2)} |")
    if notes:
        out += ["", "SUSPECT (faster than the device copy):"] + [f"- {n}" for n in notes]
    return "\n".join(out)


def plot(path, prefill_rows, decode_rows, copy_bw, gpu, date):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"plot skipped: matplotlib unavailable ({e})"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.5))
    # Panel 1: prefill TFLOP/s vs seq_len, head_dim 128, causal.
    rows = sorted([r for r, _ in prefill_rows if r["head_dim"] == 128 and r["causal"]],
                  key=lambda r: (r["seq_len"], r["batch"] or 0))
    series = {}
    for r in rows:
        for name, rec in r["ours"].items():
            series.setdefault(name, []).append((r["seq_len"], rec.get("tflops")))
        for name in BASELINES:
            if r[name]:
                series.setdefault(name, []).append((r["seq_len"], r[name].get("tflops")))
    styles = {"torch_fa2": dict(color="tab:gray", linestyle="--", marker="s"),
              "torch_cudnn": dict(color="black", linestyle="--", marker="^")}
    for name, pts in sorted(series.items(), key=lambda kv: (kv[0] in BASELINES, kv[0])):
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], label=name,
                     **styles.get(name, dict(marker="o")))
    ax1.set_xscale("log", base=2)
    lens = sorted({r["seq_len"] for r in rows})
    if lens:
        ax1.set_xticks(lens)
        ax1.set_xticklabels([f"{x // 1024}k" if x >= 1024 else str(x) for x in lens])
    ax1.set_xlabel("sequence length (batch × len = 16k tokens)")
    ax1.set_ylabel("TFLOP/s")
    ax1.set_title("prefill, bf16, head_dim 128, causal")
    ax1.grid(True, alpha=0.3)
    if series:
        ax1.legend(fontsize=8)
    else:
        ax1.text(0.5, 0.5, "no prefill data", ha="center", transform=ax1.transAxes)
    # Panel 2: decode TB/s grouped bars per shape, copy bandwidth as a line.
    drows = [r for r, _ in decode_rows]
    names = sorted({n for r in drows for n in r["ours"]})
    names += [b for b in BASELINES if any(r[b] for r in drows)]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, r in enumerate(drows):
            rec = r[name] if name in BASELINES else r["ours"].get(name)
            if rec and rec.get("tb_per_s") is not None:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(rec["tb_per_s"])
        color = {"torch_fa2": "tab:gray", "torch_cudnn": "black"}.get(name)
        ax2.bar(xs, ys, width=width, label=name, color=color)
    if copy_bw:
        ax2.axhline(copy_bw, color="tab:red", linestyle=":", label=f"device copy {copy_bw:.2f} TB/s")
    ax2.set_xticks(range(len(drows)))
    ax2.set_xticklabels([f"{r['batch']}×{r['context'] // 1024 if r['context'] >= 1024 else r['context']}"
                         f"{'k' if r['context'] >= 1024 else ''}" for r in drows], rotation=0)
    ax2.set_xlabel("batch × context (GQA 32q/8kv, head_dim 128)")
    ax2.set_ylabel("TB/s (K+V bytes read / time)")
    ax2.set_title("decode, bf16")
    ax2.grid(True, axis="y", alpha=0.3)
    if names or copy_bw:
        ax2.legend(fontsize=8)
    if not drows:
        ax2.text(0.5, 0.5, "no decode data", ha="center", transform=ax2.transAxes)
    fig.suptitle(f"attention on {gpu}, {date}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written: {path}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--gpu", default="")
    ap.add_argument("--command", default="scripts/gpu_attention_bench.sh")
    ap.add_argument("--name", default="attention-h200", help="output file stem")
    ap.add_argument("--table", default="", help="also write the markdown table to this file")
    args = ap.parse_args()

    records, steps, envs, bad = read_logs(args.logs)
    is_fp8 = lambda r: r.get("kind") == "decode" and str(r.get("kv", "bf16")) != "bf16"  # noqa: E731
    decode_fp8 = [r for r in records if is_fp8(r)]
    records = [r for r in records if not is_fp8(r)]
    prefill, decode, failures, ignored, copy = build(records)
    for r in decode_fp8:
        why = failure_reason(r)
        if why:
            failures.append({"kind": "decode", "kv": r.get("kv"),
                             "variant": f"{r.get('variant')} (kv {r.get('kv')})",
                             "shape": [r.get("batch"), r.get("context")], "error": why,
                             "source": r.get("_source")})
    for e in envs:
        if e.get("error"):
            failures.insert(0, {"kind": "torch_env", "variant": "torch", "error": e["error"],
                                "source": e.get("_source")})
    gpu = gpu_name(args.gpu, records, envs)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    # head_dim 128 first, then causal first, then by length
    pkeys = sorted(prefill, key=lambda k: (-(k[3] or 0), not k[4], k[1] or 0, k[0] or 0, k[2] or 0))
    dkeys = sorted(decode, key=lambda k: (k[0] or 0, k[1] or 0, k[2] or 0, k[3] or 0, k[4] or 0))
    prefill_rows = [(summarize(k, prefill[k], "prefill", copy["used"]), k) for k in pkeys]
    decode_rows = [(summarize(k, decode[k], "decode", copy["used"]), k) for k in dkeys]

    doc = {
        "date": date, "gpu": gpu, "command": args.command, "logs": args.logs,
        "torch_env": [public(e) for e in envs],
        "copy_tb_per_s": copy,
        "notes": "bandwidth counts bytes read + written for copies and K+V bytes read for decode; "
                 "prefill FLOPs = 4*B*H*L^2*d, halved for causal; ours = best non-torch variant",
        "prefill": [r for r, _ in prefill_rows],
        "decode": [r for r, _ in decode_rows],
        "decode_fp8": [public(r) for r in decode_fp8],
        "failures": failures,
        "steps": [public(s) for s in steps],
        "unparsed_lines": bad[:50], "unparsed_count": len(bad), "other_kinds_ignored": ignored,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    jpath = os.path.join(args.out_dir, args.name + ".json")
    with open(jpath, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    try:
        msg = plot(os.path.join(args.out_dir, args.name + ".png"), prefill_rows, decode_rows,
                   copy["used"], gpu, date)
    except Exception as e:  # noqa: BLE001 - a plot must never cost the table
        msg = f"plot failed: {type(e).__name__}: {e}"
    md = [f"## attention benchmarks — {gpu}, {date}", ""]
    if steps:
        md.append("steps: " + ", ".join(
            f"{s.get('step')}={s.get('status', s.get('rc'))}" for s in steps))
        md.append("")
    md.append(table(prefill_rows, decode_rows, copy, prefill, decode))
    if failures:
        md += ["", f"{len(failures)} failed/refused entries (details in {os.path.basename(jpath)}):"]
        for f in failures[:12]:
            md.append(f"- {f.get('kind')} {f.get('variant')} {f.get('shape', '')}: {str(f.get('error'))[:140]}")
    if bad:
        md += ["", f"{len(bad)} unparseable JSON/STEP lines (first: {bad[0][:160]})"]
    text = "\n".join(md)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text + "\n")
    print(f"report: {jpath}; {msg}", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
