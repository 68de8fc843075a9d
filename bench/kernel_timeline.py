#!/usr/bin/env python3
"""Where a CUDA-graph step's time goes, from bench/cupti_trace.cc's CSV.

    python3 bench/kernel_timeline.py trace.csv [--skip 8] [--json out.json]

Takes the graph-launched kernels (the decode steps), splits them into replays (a replay starts
where the first node of the graph appears again), keeps the replays of one graph (--graph, by
default the most replayed one: each padded batch size is a graph of its own, with the same
kernel count but other GEMM tiles and times), and for its replays after --skip reports per
kernel class (the kernel's name; GEMVs also by epilogue and grid size, which tells q|k|v, o,
gate|up, down and the lm_head apart):
  - busy: the kernel's own start-to-end time (overlapping kernels both count: PDL),
  - exposed: the part of the step's wall time charged to it: at each instant, the running kernel
    that started first (under PDL the next kernel already runs, waiting on this one); the exposed
    times and the idle gaps sum to the step's wall time,
  - marginal: how far the kernel moved the step's end past everything before it (the marginals
    and the idle gaps before them sum to the wall); lead: its start against that end (negative:
    launched early under PDL),
  - and the idle gaps in which no kernel ran;
and, between consecutive replays, the gap (the step's host side: sampling, copies, the next
launch), the time no kernel ran in it and the kernels outside the graph that did.

Then the eager steps (prefill and mixed steps run outside graphs): each starts with the
model's first kernel (EmbeddingGatherKernel) outside a graph and ends before the next step's
setup (its inputs' scatter or fed tokens), the next eager step or a graph replay; the first
--skip-eager of them (default 1: the executor's profiling pass; with --gemm-autotune also its
tuning passes) are left out. For them the count, the median and total wall time, and per
kernel class the busy time summed over all of them; beside it the total wall time of all graph
replays (first to last kernel of each; the kernels between replays, sampling and the next
inputs' scatter, are in neither total), which splits a run's device time into decode and
prefill / mixed steps.
"""
import argparse
import csv
import heapq
import json
import re
import statistics
import subprocess
import sys
from collections import defaultdict

EPILOGUES = {"0": "store", "1": "store_f32", "2": "accumulate_f32", "3": "silu_mul", "4": "rope_kv"}


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        if len(out) == len(names):
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    return names


def kernel_class(mangled, pretty, grid_x):
    m = re.search(r"GemvEpilogueE(\d)", mangled)
    if "GemvKernel" in mangled and m:
        return f"gemv/{EPILOGUES.get(m.group(1), m.group(1))}/grid{grid_x}"
    if pretty == mangled:  # not demangled: the first length-prefixed name holding "Kernel"
        i = 0
        while i < len(mangled):
            m = re.match(r"\d+", mangled[i:])
            if not m or mangled[i - 1:i].isdigit():
                i += 1
                continue
            n, i = int(m.group(0)), i + len(m.group(0))
            if "Kernel" in mangled[i:i + n]:
                return mangled[i:i + n]
            i += n
        return mangled[:60]
    base = pretty.replace("(anonymous namespace)::", "")
    base = re.sub(r"\(.*$", "", base)          # drop the argument list
    base = re.sub(r"<.*$", "", base)           # and the template arguments
    base = base.split("::")[-1].strip() or mangled[:60]
    return base.replace("void ", "")


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    names = sorted({r["name"] for r in rows})
    pretty = dict(zip(names, demangle(names)))
    kernels = []
    for r in rows:
        kernels.append({
            "start": int(r["start_ns"]), "end": int(r["end_ns"]), "graph": int(r["graph_id"]),
            "node": int(r["graph_node_id"]), "grid_x": int(r["grid_x"]),
            "cls": kernel_class(r["name"], pretty[r["name"]], int(r["grid_x"])),
        })
    kernels.sort(key=lambda k: k["start"])
    return kernels


def replays(kernels):
    """Graph-launched kernels split into replays of the same graph."""
    steps, cur, first = [], [], None
    for k in kernels:
        if k["graph"] == 0:
            continue
        if cur and (k["graph"] != cur[0]["graph"] or k["node"] == first):
            steps.append(cur)
            cur = []
        if not cur:
            first = k["node"]
        cur.append(k)
    if cur:
        steps.append(cur)
    return steps


def analyse(step):
    """Step wall, idle time, and per class busy, exposed and count. At each instant the time is
    charged to the running kernel that started first: under PDL a kernel launches early and
    waits (griddepcontrol.wait) while its predecessor still works, so the oldest running kernel
    is the one the step is waiting for."""
    busy, exposed, count = defaultdict(float), defaultdict(float), defaultdict(int)
    marginal, lead = defaultdict(float), defaultdict(float)
    last_end = None
    for k in sorted(step, key=lambda k: k["start"]):
        busy[k["cls"]] += (k["end"] - k["start"]) / 1e3
        count[k["cls"]] += 1
        # marginal: how far this kernel moved the step's end; lead: its start against the end
        # of everything before it (negative: it launched early, under PDL)
        if last_end is not None:
            marginal[k["cls"]] += max(0, k["end"] - last_end) / 1e3
            lead[k["cls"]] += (k["start"] - last_end) / 1e3
        else:
            marginal[k["cls"]] += (k["end"] - k["start"]) / 1e3
        last_end = k["end"] if last_end is None else max(last_end, k["end"])
    times = sorted({k["start"] for k in step} | {k["end"] for k in step})
    by_start = sorted(step, key=lambda k: k["start"])
    running, nxt, idle = [], 0, 0.0  # running: heap of (start, index) with lazy removal
    for t, t_next in zip(times, times[1:]):
        while nxt < len(by_start) and by_start[nxt]["start"] <= t:
            heapq.heappush(running, (by_start[nxt]["start"], nxt))
            nxt += 1
        while running and by_start[running[0][1]]["end"] <= t:
            heapq.heappop(running)
        if running:
            exposed[by_start[running[0][1]]["cls"]] += (t_next - t) / 1e3
        else:
            idle += (t_next - t) / 1e3
    wall = (times[-1] - times[0]) / 1e3
    return wall, idle, busy, exposed, count, marginal, lead


def between(kernels, steps, keep, skip):
    """The gaps between consecutive kept replays (keep(step); after the first `skip` of them):
    the step's host work shows here (sampling, copies, the next step's launch). Per gap: its
    length, the time no kernel ran, and the kernels outside the graph that ran in it."""
    loose = [k for k in kernels if k["graph"] == 0]
    gaps, idles, per_gap = [], [], []  # per_gap: {class: (busy us, count)} of each gap
    seen = 0
    for prev, nxt in zip(steps, steps[1:]):
        if not keep(prev):
            continue
        seen += 1
        if seen <= skip or not keep(nxt):
            continue
        t0 = max(k["end"] for k in prev)
        t1 = min(k["start"] for k in nxt)
        if t1 <= t0:
            continue
        inside = [k for k in loose if t0 <= k["start"] < t1]
        covered, cursor = 0, t0
        here = defaultdict(lambda: (0.0, 0))
        for k in sorted(inside, key=lambda k: k["start"]):
            end = min(k["end"], t1)
            covered += max(0, end - max(k["start"], cursor))
            cursor = max(cursor, end)
            b, c = here[k["cls"]]
            here[k["cls"]] = (b + (k["end"] - k["start"]) / 1e3, c + 1)
        gaps.append((t1 - t0) / 1e3)
        idles.append((t1 - t0 - covered) / 1e3)
        per_gap.append(here)
    if not gaps:
        return None
    # Medians over every gap (a class absent from a gap counts as 0 there).
    classes = {cls for here in per_gap for cls in here}
    return {"gaps": len(gaps), "gap_us": statistics.median(gaps),
            "idle_us": statistics.median(idles),
            "kernels": {cls: {"per_gap": statistics.median(h.get(cls, (0.0, 0))[1] for h in per_gap),
                              "busy_us": statistics.median(h.get(cls, (0.0, 0))[0] for h in per_gap)}
                        for cls in classes}}


FIRST_EAGER = "EmbeddingGatherKernel"  # RunModel's first kernel
NEXT_STEP = {"ScatterCopiesKernel", "FeedSampledTokensKernel"}  # a step's setup, before it


def eager_steps(kernels):
    """Runs of non-graph kernels, each from a FIRST_EAGER kernel up to the next one, the next
    step's setup (NEXT_STEP) or the next graph-launched kernel."""
    steps, cur = [], []
    for k in kernels:
        if k["graph"] != 0 or k["cls"] == FIRST_EAGER or k["cls"] in NEXT_STEP:
            if cur:
                steps.append(cur)
            cur = [k] if k["graph"] == 0 and k["cls"] == FIRST_EAGER else []
        elif cur:
            cur.append(k)
    if cur:
        steps.append(cur)
    return steps


def eager_summary(kernels, all_steps, skip):
    steps = eager_steps(kernels)[skip:]
    if not steps:
        return None
    walls = [(max(k["end"] for k in s) - s[0]["start"]) / 1e3 for s in steps]
    busy, count = defaultdict(float), defaultdict(int)
    for s in steps:
        for k in s:
            busy[k["cls"]] += (k["end"] - k["start"]) / 1e3
            count[k["cls"]] += 1
    replay_wall = sum((max(k["end"] for k in r) - min(k["start"] for k in r)) / 1e3
                      for r in all_steps)
    return {"steps": len(steps), "wall_us_median": statistics.median(walls),
            "wall_us_total": sum(walls), "graph_replays": len(all_steps),
            "graph_replay_wall_us_total": replay_wall,
            "kernels": {cls: {"count": count[cls], "busy_us_total": busy[cls]} for cls in busy}}


def print_eager(eager):
    total = eager["wall_us_total"]
    print(f"eager steps (prefill / mixed, outside graphs): {eager['steps']}, wall median "
          f"{eager['wall_us_median']:.1f} us, total {total / 1e3:.1f} ms; all "
          f"{eager['graph_replays']} graph replays: {eager['graph_replay_wall_us_total'] / 1e3:.1f}"
          f" ms; per class over the eager steps (busy, share of their wall):")
    for cls, v in sorted(eager["kernels"].items(), key=lambda kv: -kv[1]["busy_us_total"]):
        print(f"  {cls:42s} {v['count']:8d} {v['busy_us_total'] / 1e3:10.1f} ms "
              f"{v['busy_us_total'] / total:7.1%}")


def pick_graph(arg, steps):
    """--graph's choice: an id, the most replayed graph (0) or the widest batch (widest)."""
    if arg == "widest":
        width = defaultdict(int)
        for s in steps:
            for k in s:
                if k["cls"] == FIRST_EAGER:
                    width[s[0]["graph"]] = max(width[s[0]["graph"]], k["grid_x"])
        if width:
            return max(width, key=lambda g: width[g])
        arg = "0"
    return int(arg) or statistics.mode(s[0]["graph"] for s in steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=8, help="replays to skip (warm-up)")
    ap.add_argument("--graph", default="0",
                    help="only replays of this graph id (0: the most replayed graph; widest: the "
                         "graph of the largest batch, by its embedding gather's grid: a "
                         "throughput run's full-batch decode step)")
    ap.add_argument("--graph-size", type=int, default=0,
                    help="instead of one graph: every replay with this many kernels")
    ap.add_argument("--skip-eager", type=int, default=1,
                    help="eager steps to skip (the profiling pass; --gemm-autotune: + tuning)")
    ap.add_argument("--json", help="write the summary here too")
    a = ap.parse_args()
    kernels = load(a.trace)
    all_steps = replays(kernels)
    if not all_steps:
        eager = eager_summary(kernels, [], a.skip_eager)
        if not eager:
            sys.exit("no graph-launched kernels and no eager steps in " + a.trace)
        print_eager(eager)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"eager_steps": eager}, f, indent=1)
        return
    graphs = sorted({s[0]["graph"] for s in all_steps})
    if a.graph_size:
        gid = None
        keep = lambda s: len(s) == a.graph_size  # noqa: E731
    else:
        gid = pick_graph(a.graph, all_steps)
        keep = lambda s: s[0]["graph"] == gid  # noqa: E731
    gap = between(kernels, all_steps, keep, a.skip)
    steps = [s for s in all_steps if keep(s)][a.skip:]
    if not steps:
        sys.exit(f"no replays of graph {gid} (size {a.graph_size}) after skipping {a.skip}")
    size = statistics.mode(len(s) for s in steps)
    if gid is not None:
        print(f"graph {gid}: {len(steps)} of the {len(all_steps)} replays of the trace's "
              f"{len(graphs)} graphs (--graph picks another)")
    walls, idles = [], []
    busy, exposed, count = defaultdict(list), defaultdict(list), {}
    marginal, lead = defaultdict(list), defaultdict(list)
    for s in steps:
        w, i, b, e, c, m, l = analyse(s)
        walls.append(w)
        idles.append(i)
        for cls in b:
            busy[cls].append(b[cls])
            exposed[cls].append(e[cls])
            marginal[cls].append(m[cls])
            lead[cls].append(l[cls])
            count[cls] = c[cls]
    wall = statistics.median(walls)
    print(f"{len(steps)} replays of {size} kernels; step wall (first kernel start to last end): "
          f"median {wall:.1f} us; idle (no kernel running) median {statistics.median(idles):.1f} us")
    print(f"{'class':44s} {'per step':>8s} {'busy us':>9s} {'exposed us':>11s} {'of wall':>8s} "
          f"{'marginal us':>11s} {'lead us/each':>12s}")
    summary = {"graph_id": gid, "graphs": len(graphs), "replays": len(steps),
               "kernels_per_replay": size, "wall_us": wall,
               "idle_us": statistics.median(idles), "classes": {}}
    for cls in sorted(exposed, key=lambda c: -statistics.median(exposed[c])):
        b, e = statistics.median(busy[cls]), statistics.median(exposed[cls])
        m, l = statistics.median(marginal[cls]), statistics.median(lead[cls]) / count[cls]
        print(f"{cls:44s} {count[cls]:8d} {b:9.1f} {e:11.1f} {e / wall:8.1%} {m:11.1f} {l:12.2f}")
        summary["classes"][cls] = {"per_step": count[cls], "busy_us": b, "exposed_us": e,
                                   "marginal_us": m, "lead_us_each": l}
    if gap:
        print(f"between consecutive replays ({gap['gaps']}): median gap {gap['gap_us']:.1f} us, "
              f"no kernel running {gap['idle_us']:.1f} us; kernels outside the graph in it:")
        for cls, v in sorted(gap["kernels"].items(), key=lambda kv: -kv[1]["busy_us"]):
            if v["per_gap"] == 0:  # (in rare gaps only: another request's prefill)
                continue
            print(f"  {cls:42s} {v['per_gap']:6g} per gap {v['busy_us']:9.1f} us")
        summary["between_replays"] = gap
    eager = eager_summary(kernels, all_steps, a.skip_eager)
    if eager:
        print_eager(eager)
        summary["eager_steps"] = eager
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
