# Line profile of the Xeon's tile-completing KVCache.append (16 threads): where ~90 us outside the
# native quantiser go.
import numpy as np, kvarn, line_profiler, time
from kvarn import cache as C, _ops
H, D, G = 8, 128, 128
rng = np.random.default_rng(0)
lp = line_profiler.LineProfiler(C.KVCache._append, C.KVCache._quantize_rest, _ops.quantize_tiles_native, _ops.check_kv)
c = kvarn.KVCache(num_kv_heads=H, head_dim=D)
c.append(rng.standard_normal((H, 1024, D)).astype(np.float16), rng.standard_normal((H, 1024, D)).astype(np.float16))
tile = np.ascontiguousarray(rng.standard_normal((H, G, D)).astype(np.float16))
first, last = np.ascontiguousarray(tile[:, :G - 1]), np.ascontiguousarray(tile[:, G - 1:])
f = lp(c.append)
for _ in range(60):
    c.append(first, first)
    f(last, last)
lp.print_stats(output_unit=1e-6)
tt = []
for _ in range(100):
    t = time.perf_counter(); np.zeros((H, G, D), np.float16); np.zeros((H, G, D), np.float16); tt.append(time.perf_counter() - t)
print("two np.zeros tails: min %.1f med %.1f us" % (min(tt) * 1e6, np.median(tt) * 1e6))
tt = []
for _ in range(1000):
    t = time.perf_counter(); _ops.check_kv(last, last, H, D); tt.append(time.perf_counter() - t)
print("check_kv of one token: min %.1f med %.1f us" % (min(tt) * 1e6, np.median(tt) * 1e6))
