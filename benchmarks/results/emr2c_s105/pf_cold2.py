# Sixty-fifth session, second pass of pf_cold.py on the short contexts where a model's layers attend cold: SmolLM2 and
# headline shapes at 1K and 4K, 1 and 2 threads, 200 cold calls each (after an 8 MB sum), hot minima beside.
#   KVARN_PF_FIRST=m PYTHONPATH=site python pf_cold2.py LABEL   (pf_cold2.log: eight rounds alternating m = 0, 1)
import sys, time, numpy as np, kvarn
rng = np.random.default_rng(0)
evict = np.ones(8 << 18, np.float32)
res = []
for name, (hq, hk, d) in (("s", (9, 3, 64)), ("h", (32, 8, 128))):
    for ctx in (1024, 4096):
        c = kvarn.KVCache(hk, d)
        x = rng.standard_normal((hk, ctx, d)).astype(np.float16); c.append(x, x)
        q = rng.standard_normal((hq, d)).astype(np.float32)
        for T in (1, 2):
            hot, cold = [], []
            for i in range(200):
                evict.sum()
                t = time.perf_counter(); kvarn.attend(q, c, num_threads=T); cold.append(time.perf_counter() - t)
                t = time.perf_counter(); kvarn.attend(q, c, num_threads=T); hot.append(time.perf_counter() - t)
            res.append(f"{name}{ctx//1024}K T{T} hot {min(hot)*1e6:.1f} cold min {min(cold)*1e6:.1f} med {np.median(cold)*1e6:.1f}")
print(sys.argv[1], " | ".join(res))
