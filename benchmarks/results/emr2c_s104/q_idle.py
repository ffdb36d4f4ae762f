import sys, time, statistics, numpy as np, kvarn
from kvarn import _ops
rng=np.random.default_rng(0)
p=kvarn.PRESETS[kvarn.DEFAULT_PRESET]
for d, n in ((64, 3), (128, 8)):
    k=rng.standard_normal((n,128,d)).astype(np.float16); v=rng.standard_normal((n,128,d)).astype(np.float16)
    res = {}
    for rnd in range(3):
        for gap in ("none", "sleep"):
            for t in (1, 2):
                ts = []
                for _ in range(60):
                    if gap == "sleep": time.sleep(0.0015)
                    a = time.perf_counter(); _ops.quantize_tiles_native(k, v, p, 8, t); ts.append(time.perf_counter() - a)
                res.setdefault((gap, t), []).append(statistics.median(ts) * 1e6)
    print(f"D {d}, {n} pairs: " + ", ".join(f"{g} {t}T {min(res[(g, t)]):.0f} us" for g in ("none", "sleep") for t in (1, 2)))
