#!/usr/bin/env python3
"""Latency against load for `llm bench-serve`: a PNG from its JSON reports, one per rate.

  # a sweep: one `llm bench-serve` per request rate (reports kept in --json-dir), then the plot
  python3 bench/plot_bench_serve.py --out latency.png --llm build/llm --sweep 1,2,4,8,inf \\
      --json-dir reports -- --url http://127.0.0.1:8000 --num-prompts 200 --max-concurrency 32
  # or plot reports written earlier with `llm bench-serve --json-out FILE`
  python3 bench/plot_bench_serve.py --out latency.png reports/*.json

One panel each for time to first token, time per output token and end-to-end latency (p50
and p99, ms) against the request throughput achieved (req/s); each point is labelled with the
offered --request-rate. Also prints the table. Needs matplotlib (Debian: python3-matplotlib).
Exits 1 when a run of the sweep had failed requests (the plot is still written).
"""
import argparse
import json
import math
import os
import subprocess
import sys

PANELS = (("ttft_s", "Time to first token"), ("tpot_s", "Time per output token"),
          ("e2el_s", "End-to-end latency"))


def run_sweep(llm, rates, json_dir, bench_args):
    """Runs `llm bench-serve` once per rate; returns the report paths and the failed rates."""
    os.makedirs(json_dir, exist_ok=True)
    paths, failed = [], []
    for rate in rates:
        path = os.path.join(json_dir, f"bench-serve-rate-{rate}.json")
        command = [llm, "bench-serve", *bench_args, "--request-rate", rate, "--json-out", path]
        print("+", " ".join(command), flush=True)
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            failed.append(rate)
        if os.path.exists(path):
            paths.append(path)
    return paths, failed


def offered_rate(report):
    rate = report["request_rate"]
    return math.inf if rate == "inf" else float(rate)


def print_table(reports):
    print(f"{'rate':>6} {'req/s':>7} {'ok':>7} " +
          " ".join(f"{key[:-2] + ' p50/p99 ms':>22}" for key, _ in PANELS))
    for r in reports:
        cells = " ".join(f"{r[key]['p50'] * 1e3:>10.1f} /{r[key]['p99'] * 1e3:>10.1f}"
                         for key, _ in PANELS)
        ok = f"{r['successful_requests']}/{r['num_prompts']}"
        print(f"{str(r['request_rate']):>6} {r['request_throughput']:>7.2f} {ok:>7} {cells}")


def plot(reports, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["request_throughput"] for r in reports]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.8))
    for ax, (key, title) in zip(axes, PANELS):
        p50 = [r[key]["p50"] * 1e3 for r in reports]
        p99 = [r[key]["p99"] * 1e3 for r in reports]
        ax.plot(x, p50, "o-", label="p50")
        ax.plot(x, p99, "s--", label="p99")
        for xi, yi, r in zip(x, p50, reports):
            ax.annotate(f"{offered_rate(r):g}", (xi, yi), textcoords="offset points",
                        xytext=(4, -11), fontsize=7, color="0.35")
        ax.margins(x=0.1)
        ax.set_title(title)
        ax.set_xlabel("request throughput (req/s)")
        ax.set_ylabel("ms")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    first = reports[0]
    fig.suptitle(f"llm bench-serve {first['url']}: {first['num_prompts']} prompts per point, "
                 f"max concurrency {first['max_concurrency']} (labels: offered req/s)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main():
    argv = sys.argv[1:]
    bench_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, bench_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--sweep", help="request rates to run, e.g. 1,2,4,inf")
    parser.add_argument("--llm", default="build/llm", help="the llm binary (with --sweep)")
    parser.add_argument("--json-dir", default="bench-serve-reports",
                        help="where the sweep's reports go")
    parser.add_argument("reports", nargs="*", help="bench-serve --json-out files to plot")
    args = parser.parse_args(argv)
    paths, failed = list(args.reports), []
    if args.sweep:
        swept, failed = run_sweep(args.llm, args.sweep.split(","), args.json_dir, bench_args)
        paths += swept
    if not paths:
        parser.error("no reports: give JSON files or --sweep")
    reports = sorted((json.load(open(p)) for p in paths), key=offered_rate)
    print_table(reports)
    plot(reports, args.out)
    if failed:
        print(f"runs with failed requests at rates: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
