"""kvarn.attend at 2 threads over a random k4v2 cache (python two_threads.py HQ HK D CTX): three minima of 1 s each, us."""
import sys, numpy as np, kvarn
from timing import best
hq, hk, d, ctx = [int(x) for x in sys.argv[1:5]]
rng = np.random.default_rng(0)
k = rng.standard_normal((hk, ctx, d)).astype(np.float16)
c = kvarn.KVCache(num_kv_heads=hk, head_dim=d); c.append(k, k)
q = rng.standard_normal((hq, d)).astype(np.float32)
print(" ".join(f"{best(lambda: kvarn.attend(q, c, num_threads=2), 1.0)*1e6:.1f}" for _ in range(3)))
