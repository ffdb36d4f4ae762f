"""After a 1.5 ms Python spin: the first and second kvarn.attend (SmolLM2 shape, 1K, one thread), np.add on 16 floats
first and second, and attend after numpy has read the cache's arrays; medians of 300."""
import sys, time, statistics, numpy as np, kvarn
rng = np.random.default_rng(0)
hq, hk, d = 9, 3, 64
cache = kvarn.KVCache(hk, d)
cache.append(rng.standard_normal((hk, 1024, d), dtype=np.float32), rng.standard_normal((hk, 1024, d), dtype=np.float32))
q = rng.standard_normal((hq, d)).astype(np.float32)
a = np.ones(16, np.float32)
def spin(s):
    t = time.perf_counter()
    while time.perf_counter() - t < s: pass
res = {k: [] for k in ("first", "second", "np_add_after_spin", "np_add_hot", "touched_first")}
parts = cache.to_parts()
for _ in range(300):
    spin(0.0015)
    t0 = time.perf_counter(); kvarn.attend(q, cache, num_threads=1); t1 = time.perf_counter(); kvarn.attend(q, cache, num_threads=1); t2 = time.perf_counter()
    res["first"].append(t1 - t0); res["second"].append(t2 - t1)
    spin(0.0015)
    t0 = time.perf_counter(); np.add(a, a); t1 = time.perf_counter(); np.add(a, a); t2 = time.perf_counter()
    res["np_add_after_spin"].append(t1 - t0); res["np_add_hot"].append(t2 - t1)
    spin(0.0015)
    cache.records.sum(); cache._state[0].sum(); cache._state[1].sum()
    t0 = time.perf_counter(); kvarn.attend(q, cache, num_threads=1); res["touched_first"].append(time.perf_counter() - t0)
print(", ".join(f"{k} {statistics.median(v)*1e6:.1f} us" for k, v in res.items()))
