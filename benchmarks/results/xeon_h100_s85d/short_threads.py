"""Forty-fifth session, device call s85d: kvarn and the fp16 kernel at short contexts over 1 / 2 / 4 / 8 / 16 threads on
the lent 16-vCPU Xeon, warm (one cache re-read), the two alternating in blocks, to see whether calls of a few tens of
microseconds (the s85 grid: SmolLM2 shape 4K b1 0.91x, 1K b16 0.89x the fp16 kernel at 16 threads) would gain from
fewer threads than the machine has. Usage: python short_threads.py"""
import time

import numpy as np

import kvarn
from kvarn.fp16cache import FP16Cache, attend_fp16_batch

SHAPES = {"headline": (32, 8, 128), "smollm2": (9, 3, 64)}


def caches(shape, ctx, batch):
    hq, hk, d = SHAPES[shape]
    rng = np.random.default_rng(ctx)
    kv, f16 = [], []
    for _ in range(batch):
        k = rng.standard_normal((hk, ctx, d), dtype=np.float32)
        k[..., :4] *= 8.0
        k = k.astype(np.float16)
        v = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
        c = kvarn.KVCache(hk, d)
        c.append(k, v)
        f = FP16Cache(hk, d, capacity=ctx)
        f.append(k, v)
        kv.append(c)
        f16.append(f)
    return kv, f16, rng.standard_normal((batch, hq, d), dtype=np.float32)


for shape in SHAPES:
    for ctx in (1024, 4096, 32768):
        for batch in (1, 16):
            if ctx == 32768 and batch == 16:
                continue
            kv, f16, q = caches(shape, ctx, batch)
            for t in (1, 2, 4, 8, 16):
                run = {"kvarn": lambda: kvarn.attend_batch(q, kv, num_threads=t),
                       "fp16": lambda: attend_fp16_batch(q, f16, num_threads=t)}
                times = {name: [] for name in run}
                for fn in run.values():
                    for _ in range(5):
                        fn()
                for _ in range(10):  # alternating blocks
                    for name, fn in run.items():
                        for _ in range(20):
                            t0 = time.perf_counter()
                            fn()
                            times[name].append(time.perf_counter() - t0)
                k, f = (min(times[n]) * 1e6 for n in ("kvarn", "fp16"))
                km, fm = (float(np.median(times[n])) * 1e6 for n in ("kvarn", "fp16"))
                print(f"{shape:8s} ctx {ctx:5d} b{batch:<2d} threads {t:2d}: kvarn min {k:8.1f} med {km:8.1f} us | "
                      f"fp16 min {f:8.1f} med {fm:8.1f} us | x fp16 {f / k:5.2f}", flush=True)
