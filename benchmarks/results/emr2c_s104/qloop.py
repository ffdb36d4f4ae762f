import sys, numpy as np, kvarn
from kvarn import _ops
rng=np.random.default_rng(0)
d=int(sys.argv[1]); n=int(sys.argv[2])
k=rng.standard_normal((n,128,d)).astype(np.float16); v=rng.standard_normal((n,128,d)).astype(np.float16)
p=kvarn.PRESETS[kvarn.DEFAULT_PRESET]
for _ in range(int(sys.argv[3])): _ops.quantize_tiles_native(k,v,p,8,1)
