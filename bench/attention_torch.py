#!/usr/bin/env python3
"""Torch SDPA baselines for the GPU attention benchmarks (same shapes, same JSON lines).

torch.nn.functional.scaled_dot_product_attention with one backend forced at a time:
  torch_fa2   = SDPBackend.FLASH_ATTENTION (FlashAttention-2 inside PyTorch)
  torch_cudnn = SDPBackend.CUDNN_ATTENTION
Inputs are bf16, contiguous and token-major ([batch, tokens, heads, head_dim], passed to SDPA
as the transposed [batch, heads, tokens, head_dim] view, last dim contiguous).

  prefill: 16 heads, head_dim 128 and 64, batch x seq_len = 16384 tokens for seq_len
           512..16384, causal and non-causal. FLOPs = 4*B*H*L^2*d, halved when causal.
  decode:  GQA 32 query / 8 KV heads, head_dim 128, one query token per sequence,
           (batch, context) in (1,4k) (1,32k) (16,4k) (64,4k) (64,16k) (256,2k).
           Bytes = K + V read. Two ways to express GQA, both timed, best kept:
             enable_gqa: SDPA's enable_gqa=True (q heads h -> kv head h // 4)
             packed_q:   the 4 query heads of a group become 4 query rows of one KV head
                         (exact for one query token: no mask), no GQA support needed.
  serving: one chunked-prefill batch shaped like a serving step (issue 29): 16 prompts of
           512 new tokens over 0 / 512 / 1024 / 2048 cached tokens (4 each), 16 heads, head_dim
           128 and 64, causal from each prompt's cached context on (bottom-right aligned):
           FLOPs = sum 4*H*d*(q*ctx + q^2/2), as bench_prefill_attention_gpu --serving counts
           them. SDPA has no ragged form with cached context, so the same work runs as one call
           per context length (4 prompts each, queued back to back, one timing around all four):
             cudnn_mask: CUDNN_ATTENTION with a boolean bottom-right mask [512, ctx + 512]
                         (ctx 0: is_causal, no mask): an arbitrary mask, so cuDNN cannot skip
                         the masked tiles;
             cudnn_pieces: CUDNN_ATTENTION on exactly the same (query, key) pairs in its own
                         masks: every prompt's 512 rows over its own 512 new keys, causal (one
                         call of 16), plus each context group's rows over its cached keys, no
                         mask (3 calls of 4); the two pieces' merge by their log-sum-exps is not
                         timed (a bound in cuDNN's favour);
             fa2_lower_right: FLASH_ATTENTION with causal_lower_right (FA2's own alignment);
             varlen: torch.nn.attention.varlen.varlen_attn over the packed batch, where this
                     torch has it (one call, cu_seqlens; bottom-right causal).
           Each is checked against a float32 reference (prompt 0 of the 2048-context group).
Timing: CUDA events, warm-up, median of >= 10 (prefill) / >= 30 (decode) calls, rotating
input sets so the working set is several times the 50 MB L2. Decode is also timed as CUDA
graph replays (launch overhead out); "ms" is the graph time when capture worked.
Also: torch's device copy bandwidth (dst.copy_(src) of 2 GiB, read + written bytes).

Every result is one line `JSON {...}`; a backend that refuses a shape gives a line with an
"error" string. `--device cpu --smoke` runs tiny shapes on the CPU (logic check only).
"""
import argparse
import json
import math
import statistics
import sys
import time
import traceback
import warnings

L2_BYTES = 50 * 1024 * 1024
PREFILL_TOKENS = 16384
PREFILL_LENS = [512, 1024, 2048, 4096, 8192, 16384]
PREFILL_HEAD_DIMS = [128, 64]
PREFILL_HEADS = 16
DECODE_SHAPES = [(1, 4096), (1, 32768), (16, 4096), (64, 4096), (64, 16384), (256, 2048)]
DECODE_Q_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM = 32, 8, 128
SERVING_Q_LEN = 512
SERVING_CONTEXTS = [0, 512, 1024, 2048]  # 4 prompts each: 8,192 new tokens
SERVING_PER_CTX = 4


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def emit(obj):
    print("JSON " + json.dumps(_clean(obj), allow_nan=False, default=str), flush=True)


def finite(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class Bench:
    def __init__(self, args):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch = torch
        self.F = F
        self.sdpa_kernel = sdpa_kernel
        self.args = args
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        self.backends = {}
        for name, attr in (("torch_fa2", "FLASH_ATTENTION"), ("torch_cudnn", "CUDNN_ATTENTION")):
            be = getattr(SDPBackend, attr, None)
            self.backends[name] = be  # None: this torch has no such backend (error line)
        self.deadline = time.monotonic() + args.budget
        self.copy_tb_per_s = None
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(1234)

    # ---- helpers -------------------------------------------------------------------------
    def out_of_time(self):
        return time.monotonic() > self.deadline

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def randn(self, *shape):
        t = self.torch.randn(*shape, device=self.dev, dtype=self.torch.float32, generator=self.gen)
        return t.to(self.torch.bfloat16)

    def free(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def time_eager(self, fns, reps, warmup=3):
        """Median ms of single calls, rotating over fns (one per input set)."""
        torch = self.torch
        n = len(fns)
        for i in range(max(warmup, n)):
            fns[i % n]()
        self.sync()
        if not self.cuda:
            ts = []
            for r in range(reps):
                t0 = time.perf_counter()
                fns[r % n]()
                ts.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(ts), min(ts)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            starts[r].record()
            fns[r % n]()
            ends[r].record()
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        return statistics.median(ts), min(ts)

    def time_graph(self, fns, reps):
        """Median ms per call from CUDA graph replays of one call per input set."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        n = len(fns)
        per_replay = max(reps // n, 10)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(per_replay)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(per_replay)]
        for r in range(per_replay):
            starts[r].record()
            g.replay()
            ends[r].record()
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) / n for s, e in zip(starts, ends)]
        del g
        return statistics.median(ts), min(ts)

    def run_backend(self, variant, call):
        """Runs call() under the forced backend, turning refusals into an error string."""
        be = self.backends.get(variant)
        if be is None:
            raise RuntimeError(f"this torch ({self.torch.__version__}) has no backend for {variant}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self.sdpa_kernel(be):
                    return call()
            except Exception as e:  # noqa: BLE001 - any refusal is a result to record
                why = " | ".join(str(w.message).strip().replace("\n", " ") for w in caught[-4:])
                msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                if why:
                    msg += " | warnings: " + why
                raise RuntimeError(msg[:800]) from None

    # ---- copy ----------------------------------------------------------------------------
    def copy(self):
        torch = self.torch
        nbytes = (2 << 30) if not self.args.smoke else (64 << 20)
        try:
            src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=self.dev)
            src.normal_(generator=self.gen)
            dst = torch.empty_like(src)
            ms, best = self.time_eager([lambda: dst.copy_(src), lambda: src.copy_(dst)],
                                       reps=20, warmup=3)
            self.copy_tb_per_s = 2 * nbytes / (ms * 1e-3) / 1e12
            emit({"kind": "copy", "variant": "torch_copy", "bytes_per_copy": nbytes, "reps": 20,
                  "ms": round(ms, 5), "tb_per_s": round(self.copy_tb_per_s, 4),
                  "best_tb_per_s": round(2 * nbytes / (best * 1e-3) / 1e12, 4)})
            del src, dst
        except Exception as e:  # noqa: BLE001
            emit({"kind": "copy", "variant": "torch_copy", "error": f"{type(e).__name__}: {e}"[:800]})
        self.free()

    # ---- prefill -------------------------------------------------------------------------
    def prefill_ref_err(self, q, k, v, out, causal):
        """Max abs error vs a float32 reference for sequence 0's first and last 64 rows."""
        torch = self.torch
        L, H, d = q.shape[1], q.shape[2], q.shape[3]
        rows = sorted(set(list(range(min(64, L))) + list(range(max(0, L - 64), L))))
        idx = torch.tensor(rows, device=self.dev)
        qf = q[0, idx].float().transpose(0, 1)  # [H, R, d]
        kf = k[0].float().transpose(0, 1)  # [H, L, d]
        vf = v[0].float().transpose(0, 1)
        s = torch.matmul(qf, kf.transpose(1, 2)) / math.sqrt(d)  # [H, R, L]
        if causal:
            mask = torch.arange(L, device=self.dev)[None, :] > idx[:, None]
            s.masked_fill_(mask[None], float("-inf"))
        ref = torch.matmul(torch.softmax(s, dim=-1), vf).transpose(0, 1)  # [R, H, d]
        got = out[0, idx].float()
        return float((got - ref).abs().max())

    def prefill(self):
        torch, F = self.torch, self.F
        lens = PREFILL_LENS if not self.args.smoke else [64, 128]
        tokens = PREFILL_TOKENS if not self.args.smoke else 256
        heads = PREFILL_HEADS if not self.args.smoke else 2
        for d in PREFILL_HEAD_DIMS:
            for L in lens:
                B = max(1, tokens // L)
                one_set = 3 * B * L * heads * d * 2
                nsets = max(3, min(16, math.ceil(4 * L2_BYTES / one_set)))
                sets = None
                for causal in (True, False):
                    for variant in self.backends:
                        base = {"kind": "prefill", "variant": variant, "batch": B, "seq_len": L,
                                "num_heads": heads, "num_kv_heads": heads, "head_dim": d,
                                "causal": causal, "dtype": "bf16", "layout": "bshd"}
                        if self.out_of_time():
                            emit({**base, "error": "skipped: torch bench time budget spent"})
                            continue
                        try:
                            if sets is None:
                                sets = [tuple(self.randn(B, L, heads, d) for _ in range(3))
                                        for _ in range(nsets)]
                            outs = [None] * nsets

                            def make(i, c=causal):
                                q, k, v = sets[i]

                                def f():
                                    o = F.scaled_dot_product_attention(
                                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        is_causal=c)
                                    outs[i] = o
                                    return o
                                return f

                            fns = [make(i) for i in range(nsets)]
                            reps = max(10, self.args.prefill_reps)

                            def call():
                                return self.time_eager(fns, reps=reps, warmup=3)

                            ms, best = self.run_backend(variant, call)
                            q, k, v = sets[0]
                            out0 = outs[0].transpose(1, 2)
                            err = self.prefill_ref_err(q, k, v, out0, causal)
                            flops = 4.0 * B * heads * L * L * d * (0.5 if causal else 1.0)
                            emit({**base, "ms": round(ms, 5), "best_ms": round(best, 5),
                                  "tflops": round(flops / (ms * 1e-3) / 1e12, 3),
                                  "max_err": finite(err), "reps": reps, "input_sets": nsets})
                        except Exception as e:  # noqa: BLE001
                            emit({**base, "error": str(e)[:800]})
                            if self.cuda:
                                torch.cuda.synchronize()
                del sets
                self.free()

    # ---- serving-shaped chunked prefill --------------------------------------------------
    def serving(self):
        torch, F = self.torch, self.F
        q_len = SERVING_Q_LEN if not self.args.smoke else 64
        ctxs = SERVING_CONTEXTS if not self.args.smoke else [0, 64]
        per = SERVING_PER_CTX if not self.args.smoke else 2
        heads = PREFILL_HEADS if not self.args.smoke else 2
        try:
            from torch.nn.attention.bias import causal_lower_right
        except Exception:  # noqa: BLE001
            causal_lower_right = None
        try:
            from torch.nn.attention.varlen import varlen_attn
        except Exception:  # noqa: BLE001
            varlen_attn = None
        for d in PREFILL_HEAD_DIMS:
            flops = sum(4.0 * per * heads * d * (q_len * c + q_len * q_len / 2) for c in ctxs)
            base0 = {"kind": "serving", "prompts": per * len(ctxs), "q_len": q_len,
                     "contexts": ctxs, "per_context": per, "num_heads": heads, "head_dim": d,
                     "causal": True, "dtype": "bf16", "flops": flops}
            # Input sets: per context group q [per, q_len, H, d], k / v [per, ctx + q_len, H, d].
            one_set = sum(per * heads * d * 2 * (q_len + 2 * (c + q_len)) for c in ctxs)
            nsets = max(3, min(16, math.ceil(4 * L2_BYTES / one_set)))
            try:
                sets = [[(self.randn(per, q_len, heads, d), self.randn(per, c + q_len, heads, d),
                          self.randn(per, c + q_len, heads, d)) for c in ctxs]
                        for _ in range(nsets)]
                masks = {c: torch.ones(q_len, c + q_len, dtype=torch.bool, device=self.dev).tril(c)
                         for c in ctxs}
            except Exception as e:  # noqa: BLE001
                emit({**base0, "variant": "torch", "error": f"allocation: {e}"[:800]})
                continue

            def reference(q, k, v, c):  # prompt 0, float32, bottom-right causal
                qf, kf, vf = (x[0].float().transpose(0, 1) for x in (q, k, v))  # [H, n, d]
                sc = torch.matmul(qf, kf.transpose(1, 2)) / math.sqrt(d)
                sc.masked_fill_(~masks[c][None], float("-inf"))
                return torch.matmul(torch.softmax(sc, dim=-1), vf).transpose(0, 1)  # [q, H, d]

            def grouped(kind):
                def make(i):
                    def f():
                        outs = []
                        for (q, k, v), c in zip(sets[i], ctxs):
                            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                            if kind == "cudnn_mask":
                                o = (F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
                                     if c == 0 else F.scaled_dot_product_attention(
                                         qt, kt, vt, attn_mask=masks[c]))
                            else:
                                o = F.scaled_dot_product_attention(
                                    qt, kt, vt, attn_mask=causal_lower_right(q_len, c + q_len))
                            outs.append(o.transpose(1, 2))
                        return outs
                    return f
                return [make(i) for i in range(nsets)]

            def packed(i):  # varlen: every prompt of the set, packed along tokens
                qs, ks, vs, cq, ck = [], [], [], [0], [0]
                for (q, k, v), c in zip(sets[i], ctxs):
                    for b in range(per):
                        qs.append(q[b])
                        ks.append(k[b])
                        vs.append(v[b])
                        cq.append(cq[-1] + q_len)
                        ck.append(ck[-1] + c + q_len)
                t = lambda xs: torch.cat(xs, 0)  # noqa: E731
                iq = torch.tensor(cq, dtype=torch.int32, device=self.dev)
                ik = torch.tensor(ck, dtype=torch.int32, device=self.dev)
                return t(qs), t(ks), t(vs), iq, ik, max(ctxs) + q_len

            def pieces(i):  # cudnn_pieces: contiguous inputs made outside the timing
                g = sets[i]
                qa = torch.cat([q for q, _, _ in g], 0)
                ka = torch.cat([k[:, c:] for (_, k, _), c in zip(g, ctxs)], 0).contiguous()
                va = torch.cat([v[:, c:] for (_, _, v), c in zip(g, ctxs)], 0).contiguous()
                pre = [(q, k[:, :c].contiguous(), v[:, :c].contiguous())
                       for (q, k, v), c in zip(g, ctxs) if c > 0]
                out = {}

                def f():
                    out["new"] = F.scaled_dot_product_attention(
                        qa.transpose(1, 2), ka.transpose(1, 2), va.transpose(1, 2), is_causal=True)
                    out["pre"] = [F.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) for q, k, v in pre]
                    return out
                return f

            def piece_err():  # each piece of prompt 0 of the last group against float32
                q, k, v = sets[0][-1]
                c = ctxs[-1]
                out = pieces(0)()
                got_new = out["new"][(len(ctxs) - 1) * per].transpose(0, 1).float()  # [q, H, d]
                got_pre = out["pre"][-1][0].transpose(0, 1).float()
                qf, kf, vf = (x[0].float().transpose(0, 1) for x in (q, k, v))  # [H, n, d]

                def attend(kk, vv, causal):
                    sc = torch.matmul(qf, kk.transpose(1, 2)) / math.sqrt(d)
                    if causal:
                        sc.masked_fill_(torch.ones(q_len, q_len, dtype=torch.bool,
                                                   device=self.dev).tril().logical_not()[None],
                                        float("-inf"))
                    return torch.matmul(torch.softmax(sc, dim=-1), vv).transpose(0, 1)
                e_new = (got_new - attend(kf[:, c:], vf[:, c:], True)).abs().max()
                e_pre = (got_pre - attend(kf[:, :c], vf[:, :c], False)).abs().max()
                return float(max(e_new, e_pre))

            plans = [("cudnn_mask", "torch_cudnn"), ("cudnn_pieces", "torch_cudnn"),
                     ("fa2_lower_right", "torch_fa2"), ("varlen", None)]
            for name, backend in plans:
                base = {**base0, "variant": f"{name}"}
                if self.out_of_time():
                    emit({**base, "error": "skipped: torch bench time budget spent"})
                    continue
                try:
                    if name == "fa2_lower_right" and causal_lower_right is None:
                        raise RuntimeError("this torch has no causal_lower_right")
                    if name == "cudnn_pieces":
                        fns = [pieces(i) for i in range(nsets)]
                        reps = max(10, self.args.prefill_reps)
                        ms, best = self.run_backend(backend, lambda: self.time_eager(fns, reps))
                        err = self.run_backend(backend, piece_err)
                        emit({**base, "ms": round(ms, 5), "best_ms": round(best, 5),
                              "tflops": round(flops / (ms * 1e-3) / 1e12, 3),
                              "max_err": finite(err), "input_sets": nsets, "backend": backend,
                              "note": "two pieces per prompt, merge not timed"})
                        continue
                    if name == "varlen":
                        if varlen_attn is None:
                            raise RuntimeError("this torch has no torch.nn.attention.varlen")
                        import inspect
                        params = inspect.signature(varlen_attn).parameters
                        # causal: is_causal (torch 2.10) or window_size (-1, 0) (2.11 on)
                        causal_kw = ({"is_causal": True} if "is_causal" in params
                                     else {"window_size": [-1, 0]})
                        pk = [packed(i) for i in range(nsets)]
                        res = [None] * nsets

                        def mk(i):
                            def f():
                                q, k, v, iq, ik, mk_ = pk[i]
                                res[i] = varlen_attn(q, k, v, iq, ik, q_len, mk_, **causal_kw)
                                return res[i]
                            return f
                        fns = [mk(i) for i in range(nsets)]
                        ms, best = self.time_eager(fns, reps=max(10, self.args.prefill_reps))
                        # prompt 0 of the 2048 group sits after (len(ctxs)-1)*per prompts
                        off = (len(ctxs) - 1) * per * q_len
                        got = res[0][off:off + q_len].float()
                    else:
                        fns = grouped(name)
                        res = {}

                        def call():
                            r = self.time_eager(fns, reps=max(10, self.args.prefill_reps))
                            res["outs"] = fns[0]()
                            return r
                        ms, best = self.run_backend(backend, call)
                        got = res["outs"][-1][0].float()
                    q, k, v = sets[0][-1]
                    err = float((got - reference(q, k, v, ctxs[-1])).abs().max())
                    emit({**base, "ms": round(ms, 5), "best_ms": round(best, 5),
                          "tflops": round(flops / (ms * 1e-3) / 1e12, 3), "max_err": finite(err),
                          "input_sets": nsets, "backend": backend or "varlen_attn"})
                except Exception as e:  # noqa: BLE001
                    emit({**base, "error": f"{type(e).__name__}: {e}"[:800]})
                    if self.cuda:
                        torch.cuda.synchronize()
            del sets, masks
            self.free()

    # ---- decode --------------------------------------------------------------------------
    def decode(self):
        torch, F = self.torch, self.F
        shapes = DECODE_SHAPES if not self.args.smoke else [(1, 256), (4, 128)]
        hq, hkv, d = DECODE_Q_HEADS, DECODE_KV_HEADS, DECODE_HEAD_DIM
        group = hq // hkv
        for B, L in shapes:
            kv_bytes = 2 * B * L * hkv * d * 2
            nsets = max(3, min(64, math.ceil(4 * L2_BYTES / kv_bytes)))
            sets = None
            for variant in self.backends:
                base = {"kind": "decode", "variant": variant, "batch": B, "context": L,
                        "num_heads": hq, "num_kv_heads": hkv, "head_dim": d, "dtype": "bf16",
                        "layout": "bshd"}
                if self.out_of_time():
                    emit({**base, "error": "skipped: torch bench time budget spent"})
                    continue
                try:
                    if sets is None:
                        sets = [(self.randn(B, 1, hq, d), self.randn(B, L, hkv, d),
                                 self.randn(B, L, hkv, d)) for _ in range(nsets)]
                except Exception as e:  # noqa: BLE001
                    emit({**base, "error": f"allocation: {type(e).__name__}: {e}"[:800]})
                    break
                results, errors = {}, []
                for mode in ("enable_gqa", "packed_q"):
                    outs = [None] * nsets

                    def make(i, m=mode):
                        q, k, v = sets[i]
                        kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [B, hkv, L, d]
                        if m == "enable_gqa":
                            qt = q.transpose(1, 2)  # [B, hq, 1, d]

                            def f():
                                outs[i] = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                                return outs[i]
                        else:
                            qp = q.view(B, hkv, group, d)  # query heads h = j*group + g

                            def f():
                                o = F.scaled_dot_product_attention(qp, kt, vt)
                                outs[i] = o
                                return o
                        return f

                    try:
                        fns = [make(i) for i in range(nsets)]
                        reps = max(30, self.args.decode_reps)
                        ms_e, _ = self.run_backend(variant, lambda: self.time_eager(fns, reps, 3))
                        # reference for sequence 0 of set 0 (eager output), float32
                        q, k, v = sets[0]
                        o = outs[0]
                        got = o.reshape(B, hq, d)[0].float()  # both modes: head h = j*group + g
                        qf = q[0, 0].float().view(hkv, group, d)
                        kf, vf = k[0].float(), v[0].float()  # [L, hkv, d]
                        s = torch.einsum("jgd,ljd->jgl", qf, kf) / math.sqrt(d)
                        ref = torch.einsum("jgl,ljd->jgd", torch.softmax(s, dim=-1), vf).reshape(hq, d)
                        err = float((got - ref).abs().max())
                        ms_g, timing = None, "eager"
                        if self.cuda and not self.args.no_graph:
                            try:
                                ms_g, _ = self.run_backend(variant, lambda: self.time_graph(fns, reps))
                                timing = "graph"
                            except Exception as ge:  # noqa: BLE001
                                errors.append(f"{mode} graph: {str(ge)[:300]}")
                                torch.cuda.synchronize()
                        results[mode] = {"ms": ms_g if ms_g is not None else ms_e, "ms_eager": ms_e,
                                         "ms_graph": ms_g, "timing": timing, "max_err": finite(err)}
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"{mode}: {str(e)[:600]}")
                        if self.cuda:
                            torch.cuda.synchronize()
                if not results:
                    emit({**base, "error": " || ".join(errors)[:1500]})
                    continue
                mode = min(results, key=lambda m: results[m]["ms"])
                r = results[mode]
                tbs = kv_bytes / (r["ms"] * 1e-3) / 1e12
                line = {**base, "ms": round(r["ms"], 5), "tb_per_s": round(tbs, 4),
                        "gqa_mode": mode, "timing": r["timing"],
                        "ms_eager": round(r["ms_eager"], 5), "max_err": r["max_err"],
                        "input_sets": nsets, "reps": max(30, self.args.decode_reps),
                        "by_mode": {m: {k2: (round(v2, 5) if isinstance(v2, float) else v2)
                                        for k2, v2 in rr.items()} for m, rr in results.items()}}
                if self.copy_tb_per_s:
                    line["copy_tb_per_s"] = round(self.copy_tb_per_s, 4)
                    line["ratio_to_copy"] = round(tbs / self.copy_tb_per_s, 4)
                if errors:
                    line["notes"] = " || ".join(errors)[:800]
                emit(line)
            del sets
            self.free()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", choices=["all", "copy", "prefill", "decode", "serving"],
                    default="all", help="prefill also runs the serving-shaped batch")
    ap.add_argument("--budget", type=float, default=240.0,
                    help="seconds; shapes not started by then are reported as skipped")
    ap.add_argument("--prefill-reps", type=int, default=10)
    ap.add_argument("--decode-reps", type=int, default=30)
    ap.add_argument("--no-graph", action="store_true", help="decode: eager timing only")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (logic check, e.g. on CPU)")
    args = ap.parse_args()

    try:
        import torch
    except Exception as e:  # noqa: BLE001
        emit({"kind": "torch_env", "error": f"import torch failed: {e}"})
        return 0
    env = {"kind": "torch_env", "torch": torch.__version__,
           "cuda": getattr(torch.version, "cuda", None), "device": args.device}
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            emit({**env, "error": "torch.cuda.is_available() is False"})
            return 0
        env["gpu"] = torch.cuda.get_device_name()
        try:
            env["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001
            pass
    emit(env)
    t0 = time.monotonic()
    try:
        b = Bench(args)
    except Exception as e:  # noqa: BLE001
        emit({**env, "error": f"setup failed: {type(e).__name__}: {e}"[:800]})
        return 0
    steps = {"copy": b.copy, "decode": b.decode, "prefill": b.prefill, "serving": b.serving}
    order = {"all": ["copy", "decode", "prefill", "serving"], "copy": ["copy"],
             "prefill": ["copy", "prefill", "serving"]}.get(args.only, ["copy", args.only])
    for name in order:
        try:
            steps[name]()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            emit({"kind": name, "variant": "torch", "error": f"{type(e).__name__}: {e}"[:800]})
    print(f"attention_torch: done in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
