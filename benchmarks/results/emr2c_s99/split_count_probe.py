"""The split-count probe (fifty-ninth session): one 32K SmolLM2-shape attend, min over 3 s (python split_count_probe.py THREADS
LABEL), against a scratch build of api.cpp whose KVARN_EXP_IPT set kItemsPerThread and KVARN_EXP_RUN_THREADS ran the
layout of THREADS on that many threads; not part of the library."""
import sys, time, numpy as np, kvarn
rng=np.random.default_rng(0); c=kvarn.KVCache(num_kv_heads=3, head_dim=64)
k=rng.standard_normal((3,32768,64)).astype(np.float16); c.append(k,k); q=rng.standard_normal((9,64)).astype(np.float32)
thr=int(sys.argv[1])
b=1e9; t_end=time.time()+3
while time.time()<t_end:
    t=time.perf_counter(); kvarn.attend(q,c,num_threads=thr); b=min(b,time.perf_counter()-t)
print(sys.argv[2:], 'threads', thr, round(b*1e6,1))
