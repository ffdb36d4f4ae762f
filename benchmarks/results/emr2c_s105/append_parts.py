# Sixty-fifth session: the completing append's parts (1K cache, 2 threads; each function timed by a wrapper,
# medians over the 100 fastest of 400 appends): how much of the append is outside the native quantiser.
#   PYTHONPATH=site python append_parts.py s|h
import sys, time, numpy as np, kvarn, collections
from kvarn import _ops, cache as cache_mod
hq, hk, d = (32, 8, 128) if sys.argv[1] == "h" else (9, 3, 64)
T = 2
rng = np.random.default_rng(0)
G, ctx = 128, 1024
cache = kvarn.KVCache(hk, d)
kk = rng.standard_normal((hk, ctx, d)).astype(np.float16); vv = rng.standard_normal((hk, ctx, d)).astype(np.float16)
cache.append(kk, vv)
k = np.ascontiguousarray(kk[:, :G]); v = np.ascontiguousarray(vv[:, :G])
acc = collections.defaultdict(list)
on = [False]
def wrap(owner, name, label=None):
    f = getattr(owner, name)
    def w(*a, **kw):
        t = time.perf_counter_ns(); r = f(*a, **kw)
        if on[0]: acc[label or name].append(time.perf_counter_ns() - t)
        return r
    setattr(owner, name, w)
for n in ["quantize_tiles_native", "store_tokens", "plain_tokens", "resolve_threads"]:
    wrap(cache_mod, n)
for n in ["_settle_frozen_tail", "_writable_tail", "_records_with_room", "_commit", "_quantize_tail_tile"]:
    wrap(kvarn.KVCache, n)
grown = cache.copy()
tot = []
for r in range(400):
    grown.append(k[:, : G - 1 - grown.tail_len], v[:, : G - 1 - grown.tail_len], num_threads=T)
    for x in acc.values(): x.clear()
    on[0] = True
    t = time.perf_counter_ns(); grown.append(k[:, G - 1:], v[:, G - 1:], num_threads=T); tot.append(time.perf_counter_ns() - t)
    on[0] = False
    snap = {n: sum(x) for n, x in acc.items()}
    tot[-1] = (tot[-1], snap)
    if len(grown) > ctx + 64 * G:
        grown = cache.copy()
order = sorted(range(len(tot)), key=lambda i: tot[i][0])[:100]
print(sys.argv[1], "append med of fastest 100:", np.median([tot[i][0] for i in order]) / 1e3)
for n in tot[0][1]:
    print(f"  {n:24s} {np.median([tot[i][1].get(n, 0) for i in order]) / 1e3:8.1f} us")
