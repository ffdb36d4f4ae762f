"""The integration's host path for a one-token decode step (SmolLM2 shape, 1K tokens, one sequence): "old" = the
per-token loop it had (append, check the query, run_attend), "new" = append_attend_chunks as attend_pending now
calls it; alternating, rolled back after each, min / median of 400; then its parts. Fifty-second session: the
first version of the new path took 3.5-5 us more (the transposed 4-D query's check copies it); with a one-token
step checked as [B, Hq, D] and attended by the plain call, new - old is -5.2 to +2.9 us in the minima and -2.0 to
+2.2 us in the medians over nine runs (decode_step_overhead.log; the host was busier in the last four): within the
runs' noise, the chunk loop's own few steps (~1 us) aside.
"""
import numpy as np, kvarn, time
from kvarn._ops import append_attend_chunks, check_queries, check_scale, run_attend
rng = np.random.default_rng(0)
Hk, Hq, D = 3, 9, 64
c = kvarn.KVCache(Hk, D)
K = rng.standard_normal((Hk, 1000, D)).astype(np.float16)
c.append(K, K)
k = rng.standard_normal((1, Hk, 1, D)).astype(np.float16)  # [B, Hk, n, D] as the integration has it
q = rng.standard_normal((1, Hq, 1, D)).astype(np.float32)  # [B, Hq, n, D]
out = np.empty((1, 1, Hq, D), np.float32)
scale = check_scale(None, D)
def old():
    for i in range(1):
        c.append(k[0, :, i:i+1], k[0, :, i:i+1])
        qi = check_queries(q[:, :, i], Hk, D, ndim=3, scale=scale)
        out[:, i] = run_attend(qi, [c], scale, None)
def new():
    qs = check_queries(q[:, :, 0], Hk, D, ndim=3, scale=scale)[:, None]
    append_attend_chunks(qs, [c], k, k, scale, None, out, lambda b, e: e)
p = c.checkpoint()
for fn in (old, new) * 1: fn(); c.rollback(p)
res = {"old": [], "new": []}
for r in range(400):
    for name, fn in (("old", old), ("new", new)):
        t = time.perf_counter(); fn(); res[name].append(time.perf_counter() - t); c.rollback(p)
for name in res: print(name, f"min {min(res[name])*1e6:.1f} us  median {np.median(res[name])*1e6:.1f} us")
import timeit
qt = q.transpose(0, 2, 1, 3)
print("check_queries 3d", min(timeit.repeat(lambda: check_queries(q[:, :, 0], Hk, D, ndim=3, scale=scale), number=1000, repeat=5))*1e3, "us")
print("check_queries 4d T", min(timeit.repeat(lambda: check_queries(qt, Hk, D, ndim=4, scale=scale), number=1000, repeat=5))*1e3, "us")
print("tokens_before", min(timeit.repeat(lambda: c._tokens_before_quantising(), number=1000, repeat=5))*1e3, "us")
qs = check_queries(qt, Hk, D, ndim=4, scale=scale)
print("contig+reshape", min(timeit.repeat(lambda: np.ascontiguousarray(qs[:, 0:1]).reshape(1, Hq, D), number=1000, repeat=5))*1e3, "us")
r = np.empty((1, Hq, D), np.float32)
print("out assign", min(timeit.repeat(lambda: out.__setitem__((slice(None), slice(0, 1)), r.reshape(1, 1, Hq, D)), number=1000, repeat=5))*1e3, "us")
