"""kvarn.attend at 1K after different gaps (hot: back to back; a 1.5 ms Python spin; a 32 MB numpy read; a 1.5 ms
sleep): min over three rounds of the median of 100 calls. Args: shape (s: SmolLM2, h: headline), context, threads."""
import sys, time, statistics, numpy as np, kvarn
rng = np.random.default_rng(0)
hq, hk, d = (9, 3, 64) if sys.argv[1] == "s" else (32, 8, 128)
ctx = int(sys.argv[2])
T = int(sys.argv[3]) if len(sys.argv) > 3 else 1
cache = kvarn.KVCache(hk, d)
cache.append(rng.standard_normal((hk, ctx, d), dtype=np.float32), rng.standard_normal((hk, ctx, d), dtype=np.float32))
q = rng.standard_normal((hq, d)).astype(np.float32)
big = np.ones(8 << 20, np.float32)  # 32 MB
def spin(s):
    t = time.perf_counter()
    while time.perf_counter() - t < s: pass
gaps = {"hot": lambda: None, "spin1.5ms": lambda: spin(0.0015), "read32MB": lambda: big.sum(), "sleep1.5ms": lambda: time.sleep(0.0015)}
res = {}
for rnd in range(3):
    for g, f in gaps.items():
        ts = []
        for _ in range(100):
            f(); t = time.perf_counter(); kvarn.attend(q, cache, num_threads=T); ts.append(time.perf_counter() - t)
        res.setdefault(g, []).append(statistics.median(ts) * 1e6)
print(f"{sys.argv[1]} ctx {ctx} T{T} nbytes {cache.nbytes/1e3:.0f} KB: " + ", ".join(f"{g} {min(v):.0f} us" for g, v in res.items()))
