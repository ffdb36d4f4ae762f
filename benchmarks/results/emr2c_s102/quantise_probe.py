"""The native quantiser per call: 8 / 3 K+V pairs on 1 and 2 threads, one pair with 8 and with 0 Sinkhorn iterations\n(one thread), min and median of 200 calls."""
import time, numpy as np, kvarn
from kvarn import _ops
def best(f, n=200):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return min(ts)*1e6, float(np.median(ts))*1e6
rng=np.random.default_rng(0)
for hk,d in ((8,128),(3,64)):
    k=rng.standard_normal((hk,128,d)).astype(np.float16); v=rng.standard_normal((hk,128,d)).astype(np.float16)
    p=kvarn.PRESETS[kvarn.DEFAULT_PRESET]
    for th in (1,2):
        print(hk,d,"threads",th,"native both", best(lambda: _ops.quantize_tiles_native(k,v,p,_ops.SINKHORN_ITERS,th)))
    k1=k[:1].copy(); v1=v[:1].copy()
    print(hk,d,"one pair 1T", best(lambda: _ops.quantize_tiles_native(k1,v1,p,_ops.SINKHORN_ITERS,1)))
    print(hk,d,"one pair 0 iters", best(lambda: _ops.quantize_tiles_native(k1,v1,p,0,1)))
