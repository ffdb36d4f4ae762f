import sys, numpy as np, time
sys.path.insert(0, sys.argv[1])
import kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
p = kvarn.PRESETS["k4v2_g128"]
for H, D in ((3, 64), (8, 128)):
    k = rng.standard_normal((H, 128, D)).astype(np.float16); v = rng.standard_normal((H, 128, D)).astype(np.float16)
    k32, v32 = k.astype(np.float32), v.astype(np.float32)
    for th in (1, 2):
        row = []
        for name, f in (("f16", lambda: _ops.quantize_tiles_native(k, v, p, 8, th)), ("f32", lambda: _ops.quantize_tiles_native(k32, v32, p, 8, th))):
            for _ in range(30): f()
            ts = []
            for _ in range(300):
                t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
            row.append(f"{name} min {min(ts)*1e6:.1f}")
        print(f"{H}x{D} th{th}: " + ", ".join(row))
