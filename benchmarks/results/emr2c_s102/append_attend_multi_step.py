"""Steps of n = 2, 4, 8 tokens through kvarn.append_attend on one cache (a speculative draft verified), SmolLM2's and
the headline shape, 1K tokens, one thread: per row the best of 30 rounds' medians of 20 steps on fresh copies of the
cache (no tile completes). Run once per build."""
import numpy as np
import kvarn
from step_timing import per_step

rng = np.random.default_rng(0)
for hq, hk, d in ((9, 3, 64), (32, 8, 128)):
    cache = kvarn.KVCache(hk, d)
    cache.append(rng.standard_normal((hk, 1000, d)).astype(np.float16), rng.standard_normal((hk, 1000, d)).astype(np.float16))
    row = []
    for n in (2, 4, 8):
        q = rng.standard_normal((n, hq, d)).astype(np.float32)
        kv = rng.standard_normal((hk, n, d)).astype(np.float32)
        row.append(f"n {n}: {per_step(cache.copy, lambda c: kvarn.append_attend(q, c, kv, kv, num_threads=1), n=20):6.1f} us")
    print(f"Hq {hq} Hk {hk} D {d} ctx 1000: " + ", ".join(row), flush=True)
