# Sixty-fifth session: the completing append against the native quantiser inside it (a wrapper times that call alone),
# 1K cache, 1 and 2 threads: the time outside the native call. PYTHONPATH=site python append_over.py s|h THREADS
import sys, time, numpy as np, kvarn
from kvarn import _ops, cache as cache_mod
hq, hk, d = (32, 8, 128) if sys.argv[1] == "h" else (9, 3, 64)
T = int(sys.argv[2]) if len(sys.argv) > 2 else 2
rng = np.random.default_rng(0)
G, ctx = 128, 1024
cache = kvarn.KVCache(hk, d)
kk = rng.standard_normal((hk, ctx, d)).astype(np.float16); vv = rng.standard_normal((hk, ctx, d)).astype(np.float16)
cache.append(kk, vv)
k = np.ascontiguousarray(kk[:, :G]); v = np.ascontiguousarray(vv[:, :G])
inner = []
orig = cache_mod.quantize_tiles_native
def wrapped(*a, **kw):
    t = time.perf_counter_ns(); r = orig(*a, **kw); inner.append(time.perf_counter_ns() - t); return r
cache_mod.quantize_tiles_native = wrapped
grown = cache.copy()
tot = []
for r in range(400):
    grown.append(k[:, : G - 1 - grown.tail_len], v[:, : G - 1 - grown.tail_len], num_threads=T)
    inner.clear()
    t = time.perf_counter_ns(); grown.append(k[:, G - 1:], v[:, G - 1:], num_threads=T); tot.append((time.perf_counter_ns() - t, sum(inner)))
    if len(grown) > ctx + 64 * G:
        grown = cache.copy()
a = np.array(tot) / 1e3
i = np.argsort(a[:, 0])[:100]
print(sys.argv[1], f"T{T} append min {a[:,0].min():.1f} med {np.median(a[:,0]):.1f}; native(in append) of the 100 fastest: med {np.median(a[i,1]):.1f}; outside native med {np.median(a[i,0]-a[i,1]):.1f} min {(a[:,0]-a[:,1]).min():.1f}")
