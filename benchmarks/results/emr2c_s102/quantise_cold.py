"""The 8-pair quantise call (1 thread) back to back, after 2 ms of Python spinning, after a 2 ms sleep, after a
32 MB read, and after that read with the inputs re-read or the scratch warmed by a 0-iteration call; min and
median of 200."""
import time, numpy as np, kvarn
from kvarn import _ops
rng=np.random.default_rng(0)
p=kvarn.PRESETS[kvarn.DEFAULT_PRESET]
k=rng.standard_normal((8,128,128)).astype(np.float16); v=rng.standard_normal((8,128,128)).astype(np.float16)
big=np.ones(8<<20,np.float32)
for mode in ("none","spin","sleep","touch8M"):
    f=lambda: _ops.quantize_tiles_native(k,v,p,_ops.SINKHORN_ITERS,1)
    f(); ts=[]
    for _ in range(200):
        if mode=="spin":
            t0=time.perf_counter()
            while time.perf_counter()-t0<0.002: pass
        elif mode=="sleep": time.sleep(0.002)
        elif mode=="touch8M": big.sum()
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    print(mode, round(min(ts)*1e6,1), round(float(np.median(ts))*1e6,1))
for mode in ("touch8M+kv", "touch8M+scratchwarm"):
    f=lambda: _ops.quantize_tiles_native(k,v,p,_ops.SINKHORN_ITERS,1)
    f(); ts=[]
    k1=k[:1].copy(); v1=v[:1].copy()
    for _ in range(200):
        big.sum()
        if mode=="touch8M+kv": k.view(np.uint16).max(); v.view(np.uint16).max()
        else: _ops.quantize_tiles_native(k1,v1,p,0,1)
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    print(mode, round(min(ts)*1e6,1), round(float(np.median(ts))*1e6,1))
