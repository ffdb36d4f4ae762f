"""kvarn.attend (SmolLM2 shape, 1K, one thread): the k-th call after a Python spin of each length, medians of 100."""
import sys, time, statistics, numpy as np, kvarn
rng = np.random.default_rng(0)
cache = kvarn.KVCache(3, 64)
cache.append(rng.standard_normal((3, 1024, 64), dtype=np.float32), rng.standard_normal((3, 1024, 64), dtype=np.float32))
q = rng.standard_normal((9, 64)).astype(np.float32)
def spin(s):
    t = time.perf_counter()
    while time.perf_counter() - t < s: pass
for gap in (0.00005, 0.0002, 0.0005, 0.0015, 0.005):
    ks = [[] for _ in range(8)]
    for _ in range(100):
        spin(gap)
        for k in range(8):
            t0 = time.perf_counter(); kvarn.attend(q, cache, num_threads=1); ks[k].append(time.perf_counter() - t0)
    print(f"spin {gap*1e3:.2f} ms: calls 1..8 after it " + " ".join(f"{statistics.median(v)*1e6:.0f}" for v in ks) + " us")
