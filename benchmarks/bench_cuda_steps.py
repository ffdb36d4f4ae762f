"""Multi-token steps on the GPU: PagedKVCache.append_attend against token-by-token append + attend.

    python benchmarks/bench_cuda_steps.py [--out DIR] [--points 4096x1,32768x8] [--tokens 1,2,4,8,16]

Hq 32, Hk 8, D 128, k4v2_g128, bf16 q/k/v; each sequence holds ctx + 8 tokens (a tail of 8) in every layer.
Two measurements per point and step size n, side by side in one run:
- device: the attend launch a step makes (one launch, B x n rows of (sequence, token), each row's own lengths)
  against n one-token launches (attend with a plan, as bench_cuda.py times it), CUDA-graph replays over
  L2-rotating layers (bench_cuda.graph_time); "saved" = n x one-token / step launch;
- wall: one step per layer as a Python caller sees it (host included, eager, validate=False), append_attend
  against n x (append one token + attend), the step's tokens truncated away between repetitions (not timed);
  blocks of both alternate, medians over them.
Writes cuda_steps.json and prints the table; the step's outputs are checked against the token-by-token ones
(same cache, same inputs: rtol = atol = 2e-2 for bf16, as tests/test_cuda.py compares bf16 paths).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

import kvarn
import kvarn.cuda as kc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import D, HK, HQ, L2_ROTATE_BYTES, graph_time  # noqa: E402

TAIL = 8


def fill(ctx, batch, n_layers, n_max):
    length = ctx + TAIL
    cache = kc.PagedKVCache(HK, D, "k4v2_g128", num_layers=n_layers, max_seqs=batch, max_seq_len=length + n_max)
    ids = [cache.add_sequence() for _ in range(batch)]
    k = torch.randn(1, length, HK, D, device="cuda").to(torch.bfloat16)
    v = torch.randn(1, length, HK, D, device="cuda", dtype=torch.bfloat16)
    k[..., :4] *= 8
    for layer in range(n_layers):
        for sid in ids:
            cache.append([sid], k, v, layer=layer, validate=False)
    torch.cuda.synchronize()
    return cache, ids, length


def launch_fn(cache, ids, length, n, n_layers):
    """fn(i): the attend launch of a step of n tokens ending at `length` (rows as append_attend makes them), layer i."""
    B = len(ids)
    seen = (length - n + np.arange(1, n + 1))[None, :].repeat(B, 0).reshape(-1)
    meta, tiles = cache._meta_rows(np.repeat(ids, n), seen)
    splits, tps = cache._choose_splits(tiles, cache._programs_per_seq(HQ))
    meta_dev = kc.DeviceArray.from_numpy(meta)
    scratch = kc.DeviceArray((kc._cuda.attend_scratch_bytes(B * n, HQ, D, splits),), np.uint8)
    q = torch.randn(B, n, HQ, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    qs, os_ = kc._view(q, "q").spec(), kc._view(out, "out").spec()
    scale = 1 / math.sqrt(D)

    def fn(i):
        rc = kc._cuda.attend(cache._desc, i % n_layers, meta_dev.ptr, meta_dev.nbytes, B * n, qs, HQ, scale, os_,
                             scratch.ptr, scratch.nbytes, splits, tps, cache._choose_q_rows(HQ, B * n, splits, tps),
                             torch.cuda.current_stream().cuda_stream)
        assert rc == 0, rc

    fn.keep = (meta_dev, scratch, q, out)
    return fn, splits


def wall_times(cache, ids, length, n, n_layers, reps):
    B = len(ids)
    q = torch.randn(B, n, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, n, HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, n, HK, D, device="cuda", dtype=torch.bfloat16)
    out_step = torch.empty_like(q)
    out_tbt = torch.empty_like(q)

    def step():
        for layer in range(n_layers):
            cache.append_attend(q, ids, k, v, layer=layer, out=out_step, validate=False)

    def token_by_token():
        for layer in range(n_layers):
            for i in range(n):
                cache.append(ids, k[:, i], v[:, i], layer=layer, validate=False)
                cache.attend(q[:, i], ids, layer=layer, out=out_tbt[:, i], validate=False)

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        for sid in ids:
            cache.truncate(sid, length)
        return dt / n_layers

    for fn in (step, token_by_token):  # warm-up (allocations, split choices)
        timed(fn)
    ts, tt = [], []
    for _ in range(reps):
        ts.append(timed(step))
        tt.append(timed(token_by_token))
    close = torch.allclose(out_step.float(), out_tbt.float(), rtol=2e-2, atol=2e-2)
    return statistics.median(ts), statistics.median(tt), close


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--points", default="4096x1,32768x1,4096x8,32768x8,32768x32")
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}, {dev.multi_processor_count} SMs, torch {torch.__version__}, kvarn {kvarn.__version__}",
          flush=True)
    sizes = [int(x) for x in args.tokens.split(",")]
    R = kvarn.PRESETS["k4v2_g128"].record_bytes(D)
    rows, bad = [], []
    print("ctx x B | n | one-token launch us | step launch us | saved (n x one / step) | splits | "
          "wall: step us/layer | token by token us/layer | wall ratio | outputs agree")
    for point in args.points.split(","):
        ctx, batch = (int(x) for x in point.split("x"))
        tiles = (ctx - 128) // 128
        kv_bytes = batch * HK * (tiles * R + (128 + TAIL) * D * 4)
        n_layers = max(1, min(64, math.ceil(L2_ROTATE_BYTES / kv_bytes)))
        cache, ids, length = fill(ctx, batch, n_layers, max(sizes))
        q1 = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
        out1 = torch.empty_like(q1)
        plans = [cache.plan(ids, layer=layer) for layer in range(n_layers)]
        one_ms, _ = graph_time(lambda i: cache.attend(q1, plan=plans[i % n_layers], out=out1, validate=False),
                               2 * n_layers)
        for n in sizes:
            fn, splits = launch_fn(cache, ids, length, n, n_layers)
            step_ms, _ = graph_time(fn, 2 * n_layers)
            wall_step, wall_tbt, close = wall_times(cache, ids, length, n, min(n_layers, 8), args.reps)
            if not close:
                bad.append(f"{ctx}x{batch} n={n}")
            row = dict(ctx=ctx, batch=batch, n=n, n_layers=n_layers, one_token_us=one_ms * 1e3, step_us=step_ms * 1e3,
                       saved=n * one_ms / step_ms, splits=splits, wall_step_us=wall_step * 1e6,
                       wall_tbt_us=wall_tbt * 1e6, wall_ratio=wall_tbt / wall_step, outputs_agree=bool(close))
            rows.append(row)
            print(f"{ctx} x {batch} | {n} | {row['one_token_us']:.1f} | {row['step_us']:.1f} | {row['saved']:.2f}x | "
                  f"{splits} | {row['wall_step_us']:.0f} | {row['wall_tbt_us']:.0f} | {row['wall_ratio']:.2f}x | {close}",
                  flush=True)
        cache = plans = fn = None  # freed before the next point fills
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "cuda_steps.json"), "w") as f:
        json.dump(dict(device=dev.name, command=" ".join(sys.argv), rows=rows, disagree=bad), f, indent=1)
    if bad:
        print("step outputs differ from token by token at:", ", ".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
