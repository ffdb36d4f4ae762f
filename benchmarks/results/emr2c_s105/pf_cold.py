# Sixty-fifth session: attend hot (back to back) and cold (after summing an 8 MB array: the L2 evicted, the cache
# in the L3, as between a model's layers), 1 and 2 threads, both shapes, 1K/4K/32K. Run against a build with
# prefetch_first_item_tried.patch applied: KVARN_PF_FIRST=0 (as committed), 1 (the item's first record to L2), 2 (to L1).
#   KVARN_PF_FIRST=m PYTHONPATH=site python pf_cold.py LABEL   (pf_cold.log: three rounds alternating m = 0, 1, 2)
import sys, time, numpy as np, kvarn
rng = np.random.default_rng(0)
evict = np.ones(8 << 18, np.float32)  # 8 MB: past the 2 MB L2, inside the L3
res = []
for name, (hq, hk, d) in (("s", (9, 3, 64)), ("h", (32, 8, 128))):
    for ctx in (1024, 4096, 32768):
        c = kvarn.KVCache(hk, d)
        x = rng.standard_normal((hk, ctx, d)).astype(np.float16); c.append(x, x)
        q = rng.standard_normal((hq, d)).astype(np.float32)
        for T in (1, 2):
            hot, cold = [], []
            for i in range(60 if ctx < 32768 else 20):
                evict.sum()
                t = time.perf_counter(); kvarn.attend(q, c, num_threads=T); cold.append(time.perf_counter() - t)
                for _ in range(3):
                    t = time.perf_counter(); kvarn.attend(q, c, num_threads=T); hot.append(time.perf_counter() - t)
            res.append(f"{name}{ctx//1024}K T{T} hot {min(hot)*1e6:.1f} cold min {min(cold)*1e6:.1f} med {np.median(cold)*1e6:.1f}")
print(sys.argv[1], " | ".join(res))
