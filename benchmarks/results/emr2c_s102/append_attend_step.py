"""One-token decode steps through kvarn.append_attend against append + attend (two calls), at the SmolLM2 and
headline shapes, 1K tokens, 1 and 2 threads: per row the best of 30 rounds' medians, each round 100 steps on a
fresh copy of the cache (so every round crosses the same tail slots, no tile completes). Run once per build."""
import numpy as np
import kvarn
from step_timing import per_step

rng = np.random.default_rng(0)
for hq, hk, d in ((9, 3, 64), (32, 8, 128)):
    cache = kvarn.KVCache(hk, d)
    cache.append(rng.standard_normal((hk, 1000, d)).astype(np.float16), rng.standard_normal((hk, 1000, d)).astype(np.float16))
    q = rng.standard_normal((1, hq, d)).astype(np.float32)
    kv = rng.standard_normal((hk, 1, d)).astype(np.float32)
    for th in (1, 2):
        one = per_step(cache.copy, lambda c: kvarn.append_attend(q, c, kv, kv, num_threads=th))
        two = per_step(cache.copy, lambda c: (c.append(kv, kv, num_threads=th), kvarn.attend(q[0], c, num_threads=th)))
        print(f"Hq {hq} Hk {hk} D {d} ctx 1000 threads {th}: append_attend {one:6.1f} us, append + attend {two:6.1f} us,"
              f" ratio {one / two:.2f}", flush=True)
