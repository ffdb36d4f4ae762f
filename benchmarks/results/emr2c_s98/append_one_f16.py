"""Fifty-eighth session: a one-token KVCache.append on its own (3 kv heads x 64, ~1K tokens held), median of 3000."""
import time, statistics, sys, cProfile, pstats
import numpy as np, kvarn
c = kvarn.KVCache(3, 64)
rng = np.random.default_rng(0)
c.append(rng.standard_normal((3, 1000, 64)).astype(np.float16), rng.standard_normal((3, 1000, 64)).astype(np.float16))
k = rng.standard_normal((3, 1, 64)).astype(np.float16); v = k.copy()
def one():
    p = c.checkpoint()
    c.append(k, v)
    c.rollback(p)
ts = []
for _ in range(3000):
    t = time.perf_counter(); c.append(k, v); ts.append(time.perf_counter() - t)
    if len(c) > 1100: c.truncate(c.truncation_point(1000))
print("append one token median us %.1f" % (1e6 * statistics.median(ts)))
if len(sys.argv) > 1:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(3000):
        c.append(k, v)
        if len(c) > 1100: c.truncate(c.truncation_point(1000))
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(25)
