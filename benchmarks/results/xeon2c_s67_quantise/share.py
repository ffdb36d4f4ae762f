import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
p = kvarn.PRESETS["k4v2_g128"]
k = rng.standard_normal((8, 128, 128)).astype(np.float16); v = rng.standard_normal((8, 128, 128)).astype(np.float16)
def best(f, n=400):
    for _ in range(20): f()
    b = 1e9
    for _ in range(n):
        t = time.perf_counter(); f(); b = min(b, time.perf_counter() - t)
    return b * 1e6
for th in (1, 2):
    print(f"threads {th}: quantize_tiles_native 8 tiles fp16 {best(lambda: _ops.quantize_tiles_native(k, v, p, 8, th)):.0f} us")
# the completing append
x = rng.standard_normal((8, 1024 + 127, 128)).astype(np.float32)
base = kvarn.KVCache(8, 128); base.append(x, x)
one = rng.standard_normal((8, 1, 128)).astype(np.float32)
def app():
    c = base.copy(); t = time.perf_counter(); c.append(one, one, num_threads=2); return time.perf_counter() - t
ts = [app() for _ in range(200)]
print(f"completing append (2 threads): min {min(ts)*1e6:.0f} us; copy excluded")
