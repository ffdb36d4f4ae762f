import sys, time, numpy as np, kvarn
from kvarn import _ops
sys.path.insert(0, "/work/main/benchmarks")
hq, hk, d = (32, 8, 128) if sys.argv[1] == "h" else (9, 3, 64)
T = 2
rng = np.random.default_rng(0)
G = 128
ctx = 1024
cache = kvarn.KVCache(hk, d)
kk = rng.standard_normal((hk, ctx, d)).astype(np.float16); vv = rng.standard_normal((hk, ctx, d)).astype(np.float16)
cache.append(kk, vv)
k = np.ascontiguousarray(kk[:, :G]); v = np.ascontiguousarray(vv[:, :G])
preset = kvarn.PRESETS[kvarn.DEFAULT_PRESET]
q = rng.standard_normal((1, hq, d)).astype(np.float32)
grown = cache.copy()
def t(fn):
    a = time.perf_counter(); fn(); return time.perf_counter() - a
res = {"native": [], "append": [], "decode": []}
for r in range(300):
    res["native"].append(t(lambda: _ops.quantize_tiles_native(k, v, preset, _ops.SINKHORN_ITERS, T)))
    grown.append(k[:, : G - 1 - grown.tail_len], v[:, : G - 1 - grown.tail_len], num_threads=T)
    res["append"].append(t(lambda: grown.append(k[:, G - 1:], v[:, G - 1:], num_threads=T)))
    if len(grown) > ctx + 64 * G:
        grown = cache.copy()
    for _ in range(3):
        res["decode"].append(t(lambda: kvarn.attend_batch(q, [cache], num_threads=T)))
m = {n: min(x) * 1e6 for n, x in res.items()}
med = {n: float(np.median(x)) * 1e6 for n, x in res.items()}
print(sys.argv[1], " ".join(f"{n} min {m[n]:.1f} med {med[n]:.1f}" for n in m), f"share {100*m['append']/G/m['decode']:.2f}% native-share {100*m['native']/G/m['decode']:.2f}%")
