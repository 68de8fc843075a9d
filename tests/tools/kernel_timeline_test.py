#!/usr/bin/env python3
"""ctest kernel_timeline: bench/kernel_timeline.py on a synthetic CUPTI trace whose split is
known by hand (3 replays of a 4-kernel graph with PDL-style overlap, after a non-graph kernel,
with a sampling kernel between replays):
  q|k|v GEMV [0, 3000] ns, attention [2500, 5000] (launched early), o GEMV [4800, 8000],
  RMSNorm [8500, 9000]: at each instant the oldest running kernel is charged, so q|k|v 3.0 us,
  attention 2.0 (it still runs when o starts), o 3.0, idle 0.5, RMSNorm 0.5; wall 9.0.
Before them a profiling pass (an eager step, skipped by default); after them two eager
(mixed) steps, each from an embedding gather: [40000, 46000] (gather 1 us, a GEMM 3 us, prefill
attention 1.5 us, sampling 0.5 us; then the next step's input scatter at 47000, which belongs
to the next step) and [50000, 53000] (gather 1 us, GEMM 2 us): walls 6.0 and 3.0 us. Then 2
replays of another graph (id 6: another padded batch size, the same 4 kernels) of 3.5 us each,
which the default selection (the most replayed graph) leaves out and --graph 6 picks; the
graph replays' total wall 34.0 us."""
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEMV = ("_ZN3llm4cuda12_GLOBAL__N_110GemvKernelI13__nv_bfloat16NS1_12DTypeWeightsIS2_EELNS0_"
        "12GemvEpilogueE{}ELb0ELi1EEEvNS0_8GemvArgsE")
ATTN = "_ZN3llm4cuda12_GLOBAL__N_112DecodeKernelI13__nv_bfloat16Li128ELb0EEEvNS1_10KernelArgsE"
NORM = "_ZN3llm4cuda12_GLOBAL__N_116AddRmsNormKernelIfLi8EEEvv"
SAMPLE = "_ZN3llm4cuda12_GLOBAL__N_112SampleKernelEPKfi"
GATHER = "_ZN3llm4cuda12_GLOBAL__N_121EmbeddingGatherKernelI13__nv_bfloat16EEvv"
GEMM = "nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT"
PREFILL = "_ZN3llm4cuda12_GLOBAL__N_113PrefillKernelI13__nv_bfloat16Li128EEEvv"
SCATTER = "_ZN3llm4cuda12_GLOBAL__N_119ScatterCopiesKernelEv"


def main():
    fields = ["start_ns", "end_ns", "graph_id", "graph_node_id", "stream", "grid_x", "grid_y",
              "grid_z", "block_x", "dynamic_smem", "registers", "name"]
    rows = []

    def kernel(start, end, graph, node, name, grid):
        rows.append(dict(zip(fields, [start, end, graph, node, 7, grid, 1, 1, 256, 0, 80, name])))

    kernel(0, 5000, 0, 0, "_Z5otherv", 1)
    kernel(6000, 7000, 0, 0, GATHER, 64)  # the profiling pass
    kernel(7000, 9000, 0, 0, GEMM, 132)
    for r in range(3):
        b = 10000 + r * 10000
        kernel(b, b + 3000, 5, 100, GEMV.format(4), 3072)
        kernel(b + 2500, b + 5000, 5, 101, ATTN, 32)
        kernel(b + 4800, b + 8000, 5, 102, GEMV.format(2), 1024)
        kernel(b + 8500, b + 9000, 5, 103, NORM, 1)
        if r < 2:  # between replays (gap [b + 9000, b + 10000]): sampling, 0.4 us
            kernel(b + 9100, b + 9500, 0, 0, SAMPLE, 1)
    kernel(40000, 41000, 0, 0, GATHER, 64)
    kernel(41000, 44000, 0, 0, GEMM, 132)
    kernel(44000, 45500, 0, 0, PREFILL, 132)
    kernel(45500, 46000, 0, 0, SAMPLE, 8)
    kernel(47000, 47500, 0, 0, SCATTER, 1)
    kernel(50000, 51000, 0, 0, GATHER, 64)
    kernel(51000, 53000, 0, 0, GEMM, 132)
    for r in range(2):  # graph 6: q|k|v 1 us, attention 1, o 1, RMSNorm 0.5, back to back
        b = 60000 + r * 10000
        kernel(b, b + 1000, 6, 200, GEMV.format(4), 3072)
        kernel(b + 1000, b + 2000, 6, 201, ATTN, 32)
        kernel(b + 2000, b + 3000, 6, 202, GEMV.format(2), 1024)
        kernel(b + 3000, b + 3500, 6, 203, NORM, 1)
    with tempfile.TemporaryDirectory() as d:
        trace, out = os.path.join(d, "trace.csv"), os.path.join(d, "summary.json")
        with open(trace, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        tool = os.path.join(ROOT, "bench", "kernel_timeline.py")
        subprocess.run([sys.executable, tool, trace, "--skip", "0", "--json", out], check=True)
        s = json.load(open(out))
        subprocess.run([sys.executable, tool, trace, "--skip", "0", "--graph", "6", "--json", out],
                       check=True)
        s6 = json.load(open(out))
    assert s6["graph_id"] == 6 and s6["replays"] == 2 and abs(s6["wall_us"] - 3.5) < 1e-9, s6
    assert abs(s6["classes"]["DecodeKernel"]["exposed_us"] - 1.0) < 1e-9, s6
    assert s["graph_id"] == 5 and s["graphs"] == 2, s
    want = {"gemv/rope_kv/grid3072": 3.0, "gemv/accumulate_f32/grid1024": 3.0,
            "DecodeKernel": 2.0, "AddRmsNormKernel": 0.5}
    got = {c: v["exposed_us"] for c, v in s["classes"].items()}
    assert s["replays"] == 3 and s["kernels_per_replay"] == 4, s
    assert abs(s["wall_us"] - 9.0) < 1e-9 and abs(s["idle_us"] - 0.5) < 1e-9, s
    assert set(got) == set(want), got
    for c, v in want.items():
        assert abs(got[c] - v) < 1e-9, (c, got[c], v)
    assert abs(s["classes"]["DecodeKernel"]["busy_us"] - 2.5) < 1e-9, s
    # marginal: how far each kernel moved the step's end (idle gaps before it included: the
    # marginals sum to the wall); lead: its start minus the end of everything before it
    want_marginal = {"gemv/rope_kv/grid3072": (3.0, 0.0), "DecodeKernel": (2.0, -0.5),
                     "gemv/accumulate_f32/grid1024": (3.0, -0.2), "AddRmsNormKernel": (1.0, 0.5)}
    for c, (m, l) in want_marginal.items():
        got_m, got_l = s["classes"][c]["marginal_us"], s["classes"][c]["lead_us_each"]
        assert abs(got_m - m) < 1e-9 and abs(got_l - l) < 1e-9, (c, got_m, got_l, m, l)
    # Between consecutive replays: 2 gaps of 1.0 us, 0.4 us of them sampling, 0.6 idle.
    g = s["between_replays"]
    assert g["gaps"] == 2 and abs(g["gap_us"] - 1.0) < 1e-9 and abs(g["idle_us"] - 0.6) < 1e-9, g
    assert set(g["kernels"]) == {"SampleKernel"}, g
    assert g["kernels"]["SampleKernel"]["per_gap"] == 1, g
    assert abs(g["kernels"]["SampleKernel"]["busy_us"] - 0.4) < 1e-9, g
    # Eager steps: the two mixed steps, the graph replays' total, per class busy over them.
    e = s["eager_steps"]
    assert e["steps"] == 2 and abs(e["wall_us_median"] - 4.5) < 1e-9, e
    assert abs(e["wall_us_total"] - 9.0) < 1e-9 and e["graph_replays"] == 5, e
    assert abs(e["graph_replay_wall_us_total"] - 34.0) < 1e-9, e
    want_eager = {"EmbeddingGatherKernel": (2, 2.0), GEMM: (2, 5.0), "PrefillKernel": (1, 1.5),
                  "SampleKernel": (1, 0.5)}
    assert set(e["kernels"]) == set(want_eager), e["kernels"]
    for c, (n, b) in want_eager.items():
        assert e["kernels"][c]["count"] == n and abs(e["kernels"][c]["busy_us_total"] - b) < 1e-9, (
            c, e["kernels"][c])
    print("kernel_timeline: ok")


if __name__ == "__main__":
    main()
