import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
hq, hk, d = (32, 8, 128) if len(sys.argv) < 6 else (9, 3, 64)
ctx = int(sys.argv[3])
rng = np.random.default_rng(ctx)
k = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
v = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
cache = kvarn.KVCache(hk, d); cache.append(k, v)
q = rng.standard_normal((hq, d), dtype=np.float32)
kvarn.set_num_threads(int(__import__("os").environ.get("T", "2")))
for _ in range(20): cache.attend(q)
ts = []
for _ in range(int(sys.argv[4])):
    t0 = time.perf_counter(); cache.attend(q); ts.append(time.perf_counter() - t0)
ts.sort(); print(sys.argv[2], f"{ts[0]*1e3:.4f} {ts[len(ts)//4]*1e3:.4f} {ts[len(ts)//2]*1e3:.4f}")
