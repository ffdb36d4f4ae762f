"""kvarn vs the fp16 kernel at one shape and context, 1 and 2 threads, alternating rounds (min of 0.7 s each)."""
import sys, numpy as np, kvarn
from timing import best
from kvarn.fp16cache import FP16Cache
hq, hk, d, ctx = [int(x) for x in sys.argv[1:5]]
rng = np.random.default_rng(0)
k = rng.standard_normal((hk, ctx, d)).astype(np.float16); v = rng.standard_normal((hk, ctx, d)).astype(np.float16)
c = kvarn.KVCache(num_kv_heads=hk, head_dim=d); c.append(k, v)
f = FP16Cache(num_kv_heads=hk, head_dim=d); f.append(k, v)
q = rng.standard_normal((hq, d)).astype(np.float32)
for rnd in range(3):
    row = []
    for th in (1, 2):
        tk = best(lambda: kvarn.attend(q, c, num_threads=th), 0.7); tf = best(lambda: f.attend(q, num_threads=th), 0.7)
        row.append(f"{th}T kvarn {tk*1e6:7.1f} fp16 {tf*1e6:7.1f} x{tf/tk:.2f}")
    print(f"round {rnd}: " + " | ".join(row), flush=True)
