import sys, time, os
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
D = int(os.environ.get("D", 128)); n = 8
k = rng.standard_normal((n, 128, D), dtype=np.float32).astype(np.float16); v = rng.standard_normal((n, 128, D), dtype=np.float32).astype(np.float16)
pre = kvarn.PRESETS["k4v2_g128"]
t0 = time.perf_counter()
while time.perf_counter() - t0 < float(os.environ.get("SECS", 8)):
    _ops.quantize_tiles_native(k, v, pre, _ops.SINKHORN_ITERS, 1)
