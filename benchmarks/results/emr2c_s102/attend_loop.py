"""Perf target: argv[2] one-thread attend_batch calls over a 32K-token k4v2 cache, headline shape (argv[1] h)
or SmolLM2's (s): `perf record -e cpu-clock python attend_loop.py h 1500`."""
import sys, numpy as np, kvarn
rng=np.random.default_rng(0)
hq,hk,d=(32,8,128) if sys.argv[1]=="h" else (9,3,64)
n=32768
c=kvarn.KVCache(hk,d)
k=rng.standard_normal((hk,n,d)).astype(np.float16); v=rng.standard_normal((hk,n,d)).astype(np.float16)
c.append(k,v,num_threads=2)
q=rng.standard_normal((1,hq,d)).astype(np.float32)
for _ in range(int(sys.argv[2])): kvarn.attend_batch(q,[c],num_threads=1)
