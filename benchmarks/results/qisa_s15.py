# Quantiser A/B: python qisa_s15.py avx512 avx2 with PYTHONPATH at one build, then the other, alternating.
import numpy as np, kvarn, time, sys
from kvarn import _ops
preset = kvarn.PRESETS[kvarn.DEFAULT_PRESET]
rng=np.random.default_rng(0)
k=rng.standard_normal((8,128,128),dtype=np.float32); k[...,:4]*=8
v=rng.standard_normal((8,128,128),dtype=np.float32)
for isa in sys.argv[1:]:
    kvarn.set_isa(isa)
    best=[]
    for r in range(5):
        t=time.perf_counter(); n=0
        while time.perf_counter()-t<1.0:
            _ops.quantize_tiles_native(k, v, preset, _ops.SINKHORN_ITERS, 1); n+=1
        best.append((time.perf_counter()-t)/n/8*1e6)
    print(isa, "us per record (1 thread) median", sorted(best)[2], "min", min(best))
