"""Where a completing append's time goes outside the native quantiser (Hk 8, D 128, two threads, 300 appends of the
token that completes a tile, after 127 tokens): each part timed by a wrapper (about 0.2 us each of its own)."""
import time, numpy as np, kvarn
from kvarn import cache as C, _ops, _native
rng = np.random.default_rng(0)
hk, d, G, th = 8, 128, 128, 2
k = rng.standard_normal((hk, 1024, d)).astype(np.float16); v = rng.standard_normal((hk, 1024, d)).astype(np.float16)
c = kvarn.KVCache(num_kv_heads=hk, head_dim=d); c.append(k, v)
kt = np.ascontiguousarray(k[:, :G]); vt = np.ascontiguousarray(v[:, :G])
acc = {}
def wrap(obj, name, key):
    f = getattr(obj, name)
    def w(*a, **kw):
        t = time.perf_counter(); r = f(*a, **kw); acc.setdefault(key, []).append(time.perf_counter() - t); return r
    setattr(obj, name, w)
wrap(C.KVCache, "_commit", "commit"); wrap(C.KVCache, "_settle_frozen_tail", "settle"); wrap(C, "store_tokens", "store")
wrap(C.KVCache, "_records_with_room", "room"); wrap(_native, "quantize_tiles_f16", "native")
wrap(C, "quantize_tiles_native", "qwrap")
g = c.copy()
tot = []
for i in range(300):
    g.append(kt[:, : G - 1 - g.tail_len], vt[:, : G - 1 - g.tail_len], num_threads=th)
    for key in [x for x in acc if not x.endswith("_all")]: acc[key].clear()
    a = time.perf_counter(); g.append(kt[:, G-1:], vt[:, G-1:], num_threads=th); tot.append(time.perf_counter() - a)
    for key in [x for x in acc if not x.endswith("_all")]: acc.setdefault(key + "_all", []).append(sum(acc[key]))
tot = np.array(tot) * 1e6
print(f"completing append median {np.median(tot):.1f} us")
for key in ("native", "qwrap", "room", "store", "commit", "settle"):
    x = np.array(acc[key + "_all"]) * 1e6
    print(f"  {key}: median {np.median(x):.1f} min {x.min():.1f}")
x = tot - np.array(acc["qwrap_all"]) * 1e6 - np.array(acc["room_all"]) * 1e6 - np.array(acc["store_all"]) * 1e6 - np.array(acc["commit_all"]) * 1e6 - np.array(acc["settle_all"]) * 1e6
print(f"  rest: median {np.median(x):.1f} min {x.min():.1f}")
