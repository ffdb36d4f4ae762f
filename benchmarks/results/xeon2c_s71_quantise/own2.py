import sys, numpy as np, time, collections
sys.path.insert(0, sys.argv[1])
import kvarn
from kvarn import _ops, cache as C, _native
H, D, th = 3, 64, 2
rng = np.random.default_rng(0)
k = rng.standard_normal((H, 128, D)).astype(np.float16); v = k.copy()
x = rng.standard_normal((H, 1024, D)).astype(np.float16)
acc = collections.defaultdict(list); on = [False]
def wrap(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **kw):
        t = time.perf_counter(); r = f(*a, **kw)
        if on[0]: acc[label].append(time.perf_counter() - t)
        return r
    setattr(obj, name, w)
wrap(_native, "quantize_tiles_f16", "native")
wrap(C.KVCache, "_quantize_rest", "_quantize_rest")
wrap(C, "quantize_tiles_native", "quantize_tiles_native")
wrap(C.KVCache, "_settle_frozen_tail", "_settle_frozen_tail")
wrap(C, "store_tokens_f16", "store_tokens_f16")
wrap(C, "plain_tokens", "plain_tokens")
wrap(C.KVCache, "_publish", "_publish")
wrap(C.KVCache, "_stage_full_tail", "_stage_full_tail")
wrap(C.KVCache, "_append", "_append")
wrap(C, "resolve_threads", "resolve_threads")
c = kvarn.KVCache(H, D); c.append(x, x)
tot = []
for r in range(400):
    c.append(k[:, : 127 - c.tail_len], v[:, : 127 - c.tail_len], num_threads=th)
    on[0] = True; t = time.perf_counter(); c.append(k[:, 127:], v[:, 127:], num_threads=th); tot.append(time.perf_counter() - t); on[0] = False
    if r % 20 == 19: c = kvarn.KVCache(H, D); c.append(x, x)
print(f"total min {min(tot)*1e6:.1f}")
for label, ts in acc.items():
    n = len(ts) / len(tot)
    print(f"{label:24s} calls/append {n:.0f}  min per call {min(ts)*1e6:6.2f}  median {np.median(ts)*1e6:6.2f} us")
