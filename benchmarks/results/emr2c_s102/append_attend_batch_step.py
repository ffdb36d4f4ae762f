"""One-token decode steps of B sequences (SmolLM2's shape, 500-1055 tokens) through kvarn.append_attend_batch,
against B appends + one attend_batch, one thread: per row the best of 20 rounds' medians, each round 100 steps
on fresh copies of the caches. Run once per build."""
import numpy as np
import kvarn
from step_timing import per_step

rng = np.random.default_rng(0)
hq, hk, d = 9, 3, 64
for B in (1, 4, 16):
    caches = []
    for b in range(B):
        c = kvarn.KVCache(hk, d)
        n = 500 + 37 * b
        c.append(rng.standard_normal((hk, n, d)).astype(np.float16), rng.standard_normal((hk, n, d)).astype(np.float16))
        caches.append(c)
    q = rng.standard_normal((B, 1, hq, d)).astype(np.float32)
    kv = rng.standard_normal((B, hk, 1, d)).astype(np.float32)

    def separate(cs):
        for b, c in enumerate(cs):
            c.append(kv[b], kv[b], num_threads=1)
        return kvarn.attend_batch(q[:, 0], cs, num_threads=1)

    def fresh():
        return [c.copy() for c in caches]

    one = per_step(fresh, lambda cs: kvarn.append_attend_batch(q, cs, kv, kv, num_threads=1), rounds=20)
    two = per_step(fresh, separate, rounds=20)
    print(f"B {B:2d}: append_attend_batch {one:6.1f} us, appends + attend_batch {two:6.1f} us, ratio {one / two:.2f}",
          flush=True)
