"""attend_batch over B random k4v2 caches of ctx tokens each, one thread against two (python batch_scaling.py HQ HK D CTX B):
the min of 3 rounds of 1 s each."""
import sys, time, numpy as np, kvarn
hq, hk, d, ctx, B = [int(x) for x in sys.argv[1:6]]
rng = np.random.default_rng(0)
caches = []
for b in range(B):
    c = kvarn.KVCache(num_kv_heads=hk, head_dim=d)
    k = rng.standard_normal((hk, ctx, d)).astype(np.float16); c.append(k, k); caches.append(c)
q = rng.standard_normal((B, hq, d)).astype(np.float32)
def best(fn, secs=1.0):
    fn(); b = 1e9; t_end = time.time() + secs
    while time.time() < t_end:
        t = time.perf_counter(); fn(); b = min(b, time.perf_counter() - t)
    return b
r = [(best(lambda: kvarn.attend_batch(q, caches, num_threads=1)), best(lambda: kvarn.attend_batch(q, caches, num_threads=2))) for _ in range(3)]
t1 = min(x[0] for x in r); t2 = min(x[1] for x in r)
print(f"B {B} ctx {ctx}: 1T {t1*1e6:.0f} us 2T {t2*1e6:.0f} us speed-up {t1/t2:.2f}")
