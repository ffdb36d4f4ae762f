"""Native quantiser, 8 (headline) and 3 (SmolLM2) K+V pairs, 1 and 2 threads, min of 300 calls, one process per
build and round (builds = site directories on argv), ROUNDS rounds alternating."""
import sys, subprocess, json
code = r'''
import time, numpy as np, kvarn, json, sys
from kvarn import _ops
rng=np.random.default_rng(0)
out={}
for hk,d in ((8,128),(3,64)):
    k=rng.standard_normal((hk,128,d)).astype(np.float16); v=rng.standard_normal((hk,128,d)).astype(np.float16)
    p=kvarn.PRESETS[kvarn.DEFAULT_PRESET]
    for th in (1,2):
        f=lambda: _ops.quantize_tiles_native(k,v,p,_ops.SINKHORN_ITERS,th)
        f(); ts=[]
        for _ in range(300):
            t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
        out[f"D{d} {th}T"]=min(ts)*1e6
print(json.dumps(out))
'''
sites = sys.argv[1:]
res = {s: [] for s in sites}
for r in range(int(__import__('os').environ.get('ROUNDS', 3))):
    for s in sites:
        o = subprocess.run([sys.executable, '-c', code], env={'PYTHONPATH': s, 'PATH': '/usr/bin'}, capture_output=True, text=True)
        res[s].append(json.loads(o.stdout))
for s in sites:
    keys = res[s][0].keys()
    print(s, {k: [round(x[k], 1) for x in res[s]] for k in keys})
