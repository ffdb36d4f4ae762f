"""Perf target: argv[3] calls of the native quantiser on one K+V pair (128 tokens, head_dim argv[1], argv[2]
Sinkhorn iterations, fp16 input, one thread): `perf record -e cpu-clock python quantise_loop.py 128 8 40000`."""
import sys, numpy as np, kvarn
from kvarn import _ops
rng=np.random.default_rng(0)
d=int(sys.argv[1]); iters=int(sys.argv[2])
k=rng.standard_normal((1,128,d)).astype(np.float16); v=rng.standard_normal((1,128,d)).astype(np.float16)
p=kvarn.PRESETS[kvarn.DEFAULT_PRESET]
for _ in range(int(sys.argv[3])): _ops.quantize_tiles_native(k,v,p,iters,1)
