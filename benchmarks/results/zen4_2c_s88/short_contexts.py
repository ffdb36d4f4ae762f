# Forty-eighth session: kvarn.attend against the fp16 kernel (FP16Cache.attend) at 1K / 4K, both shapes, 1 and 2 threads;
# min over 5 blocks of 2000 calls each, one process. Run: PYTHONPATH=<site> python short_contexts.py
import time, sys, numpy as np, kvarn
from kvarn.fp16cache import FP16Cache
rng = np.random.default_rng(0)
def mk(hk, d, n):
    k = rng.standard_normal((hk, n, d)).astype(np.float16); v = rng.standard_normal((hk, n, d)).astype(np.float16)
    c = kvarn.KVCache(hk, d); c.append(k, v); f = FP16Cache(hk, d); f.append(k, v); return c, f
def tmin(fn, reps=2000):
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps): fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return best
for hq, hk, d in [(9, 3, 64), (32, 8, 128)]:
    for n in [1024, 4096]:
        c, f = mk(hk, d, n)
        q = rng.standard_normal((hq, d)).astype(np.float32)
        for th in [1, 2]:
            kvarn.set_num_threads(th)
            tk = tmin(lambda: kvarn.attend(q, c)); tf = tmin(lambda: f.attend(q))
            print(f"Hq{hq} Hk{hk} D{d} n{n} th{th}: kvarn {tk*1e6:7.1f} us  fp16 {tf*1e6:7.1f} us  ratio {tf/tk:.2f}")
