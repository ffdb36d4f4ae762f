import sys, time, os
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
D = int(os.environ.get("D", 128)); n = int(os.environ.get("NT", 8))
k = rng.standard_normal((n, 128, D), dtype=np.float32); v = rng.standard_normal((n, 128, D), dtype=np.float32)
pre = kvarn.PRESETS["k4v2_g128"]
f = lambda: _ops.quantize_tiles_native(k, v, pre, _ops.SINKHORN_ITERS, 1)
for _ in range(20): f()
secs = float(os.environ.get("SECS", 3))
t0 = time.perf_counter(); c = 0
best = 1e9
while time.perf_counter() - t0 < secs:
    a = time.perf_counter(); f(); best = min(best, time.perf_counter() - a); c += 1
print(kvarn.active_isa(), f"D={D} best {best*1e6/n:.1f} us/tile, calls {c}")
