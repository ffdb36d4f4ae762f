"""One thread, warm: CALLS decode calls over a kvarn k4v2 cache and the same number over an FP16Cache of the same
K/V (SHAPE=hk,hq,d, CTX tokens), for callgrind to count the kernels' instructions (valgrind has no AVX-512, so
dispatch picks avx2 under it: the AVX2-only machines' instruction mix, without AVX-VNNI)."""
import os
import numpy as np
import kvarn

hk, hq, d = (int(x) for x in os.environ.get("SHAPE", "3,9,64").split(","))
ctx, calls = int(os.environ.get("CTX", "32768")), int(os.environ.get("CALLS", "4"))
kvarn.set_num_threads(1)
rng = np.random.default_rng(0)
k = rng.standard_normal((hk, ctx, d)).astype(np.float16)
v = rng.standard_normal((hk, ctx, d)).astype(np.float16)
q = rng.standard_normal((hq, d)).astype(np.float32)
c = kvarn.KVCache(hk, d)
c.append(k, v)
f = kvarn.FP16Cache(hk, d)
f.append(k, v)
print(kvarn.active_isa(), kvarn.score_mode(), c.num_tiles, "tiles")
for _ in range(calls):
    kvarn.attend(q, c)
for _ in range(calls):
    f.attend(q)
