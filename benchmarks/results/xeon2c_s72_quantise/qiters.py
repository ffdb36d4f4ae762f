import sys, time, os
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
D = int(os.environ.get("D", 128)); n = 8
k = rng.standard_normal((n, 128, D), dtype=np.float32); v = rng.standard_normal((n, 128, D), dtype=np.float32)
pre = kvarn.PRESETS["k4v2_g128"]
for iters in (0, 1, 2, 4, 8, 16):
    f = lambda: _ops.quantize_tiles_native(k, v, pre, iters, 1)
    for _ in range(20): f()
    best = 1e9; t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.5:
        a = time.perf_counter(); f(); best = min(best, time.perf_counter() - a)
    print(kvarn.active_isa(), f"D={D} iters={iters} best {best*1e6/n:.2f} us/(tile,head)")
