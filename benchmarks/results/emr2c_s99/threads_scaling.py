"""One- and two-thread kvarn.attend times over random k4v2 caches (python threads_scaling.py HQ HK D): per context
the min of 3 rounds of 1 s each per thread count, the speed-up and the 2-thread time beyond half the 1-thread time."""
import sys, time, numpy as np, kvarn
hq, hk, d = [int(x) for x in sys.argv[1:4]]
rng = np.random.default_rng(0)
def best(fn, secs=1.0):
    fn(); b = 1e9; t_end = time.time() + secs
    while time.time() < t_end:
        t = time.perf_counter(); fn(); b = min(b, time.perf_counter() - t)
    return b
for ctx in (4096, 16384, 32768, 65536):
    c = kvarn.KVCache(num_kv_heads=hk, head_dim=d)
    k = rng.standard_normal((hk, ctx, d)).astype(np.float16); v = rng.standard_normal((hk, ctx, d)).astype(np.float16)
    c.append(k, v); q = rng.standard_normal((hq, d)).astype(np.float32)
    r = []
    for rnd in range(3):
        t1 = best(lambda: kvarn.attend(q, c, num_threads=1)); t2 = best(lambda: kvarn.attend(q, c, num_threads=2))
        r.append((t1, t2))
    t1 = min(x[0] for x in r); t2 = min(x[1] for x in r)
    print(f"ctx {ctx:6d}: 1T {t1*1e6:8.1f} us  2T {t2*1e6:8.1f} us  speed-up {t1/t2:.2f}  overhead {(t2 - t1/2)*1e6:.1f} us")
