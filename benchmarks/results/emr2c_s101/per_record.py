"""Per-record time of kvarn.attend on one thread, random k4v2 caches (python per_record.py HQ HK D): the time's
growth from 1K to 4K tokens (records in L2) and from 16K to 32K (in L3) over the records added, min of 0.7 s per
context, three rounds. S61_NOVBMI=1: the avx512 kernels' forms without VBMI (kvarn._native.set_vbmi(False))."""
import sys, numpy as np, kvarn
from timing import best
hq, hk, d = [int(x) for x in sys.argv[1:4]]
import os
rng = np.random.default_rng(0)
if os.environ.get("S61_NOVBMI"):
    from kvarn import _native
    _native.set_vbmi(False)
caches = {}
for ctx in (1024, 4096, 16384, 32768):
    c = kvarn.KVCache(num_kv_heads=hk, head_dim=d)
    k = rng.standard_normal((hk, ctx, d)).astype(np.float16); v = rng.standard_normal((hk, ctx, d)).astype(np.float16)
    c.append(k, v); caches[ctx] = c
q = rng.standard_normal((hq, d)).astype(np.float32)
for rnd in range(3):
    t = {ctx: best(lambda: kvarn.attend(q, c, num_threads=1), 0.7) for ctx, c in caches.items()}
    rec = lambda a, b: (t[b] - t[a]) / ((b - a) // 128 * hk) * 1e9
    print(f"round {rnd}: " + " ".join(f"{ctx}:{t[ctx]*1e6:.1f}us" for ctx in t)
          + f" | ns/record 1K-4K {rec(1024,4096):.0f}  16K-32K {rec(16384,32768):.0f}", flush=True)
