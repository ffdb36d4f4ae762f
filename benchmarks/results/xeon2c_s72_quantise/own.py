import sys, numpy as np, time
sys.path.insert(0, sys.argv[1])
import kvarn
from kvarn import _ops, cache as C, _native
H, D, th = int(sys.argv[2]), int(sys.argv[3]), 2
rng = np.random.default_rng(0)
k = rng.standard_normal((H, 128, D)).astype(np.float16); v = k.copy()
x = rng.standard_normal((H, 1024, D)).astype(np.float16)
orig = _native.quantize_tiles_f16
nat = []; on = [False]
def timed(*a):
    t = time.perf_counter(); r = orig(*a)
    if on[0]: nat.append(time.perf_counter() - t)
    return r
_native.quantize_tiles_f16 = timed
c = kvarn.KVCache(H, D); c.append(x, x)
tot = []; nat.clear()
for r in range(400):
    c.append(k[:, : 127 - c.tail_len], v[:, : 127 - c.tail_len], num_threads=th)
    on[0] = True; t = time.perf_counter(); c.append(k[:, 127:], v[:, 127:], num_threads=th); tot.append(time.perf_counter() - t); on[0] = False
    if r % 20 == 19: c = kvarn.KVCache(H, D); c.append(x, x)
tot = np.array(tot); nat = np.array(nat); assert len(nat) == len(tot)
own = tot - nat
print(f"{H}x{D}: completing append min {tot.min()*1e6:.1f} med {np.median(tot)*1e6:.1f}; native call min {nat.min()*1e6:.1f} med {np.median(nat)*1e6:.1f}; rest (Python) min {own.min()*1e6:.1f} med {np.median(own)*1e6:.1f} us")
