"""The native quantiser for 1-16 K+V pairs (headline shape), 1 and 2 threads, min of 400 calls."""
import time, numpy as np, kvarn
from kvarn import _ops
def best(f, n=400):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return round(min(ts)*1e6,1)
rng=np.random.default_rng(0)
p=kvarn.PRESETS[kvarn.DEFAULT_PRESET]
for n in (1,2,4,8,16):
    k=rng.standard_normal((n,128,128)).astype(np.float16); v=rng.standard_normal((n,128,128)).astype(np.float16)
    print(n, [best(lambda: _ops.quantize_tiles_native(k,v,p,_ops.SINKHORN_ITERS,th)) for th in (1,2)])
