"""The native quantiser (8 tiles of k4v2 at D 128) on one and two threads, back to back and after a 2 ms sleep: min
and median of 100 calls each, two rounds."""
import time, numpy as np, kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
pre = kvarn.PRESETS["k4v2_g128"]
k = rng.standard_normal((8, 128, 128)).astype(np.float16); v = rng.standard_normal((8, 128, 128)).astype(np.float16)
def t(th, idle):
    best = []
    for _ in range(100):
        if idle: time.sleep(idle)
        a = time.perf_counter(); _ops.quantize_tiles_native(k, v, pre, _ops.SINKHORN_ITERS, th); best.append(time.perf_counter() - a)
    return min(best) * 1e6, float(np.median(best)) * 1e6
for r in range(2):
    for th, idle in ((1, 0), (2, 0), (1, 0.002), (2, 0.002)):
        mn, md = t(th, idle)
        print(f"threads {th} idle {idle*1e3:.0f} ms: min {mn:.1f} median {md:.1f} us")
