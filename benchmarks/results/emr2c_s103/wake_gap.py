"""kvarn.attend (SmolLM2 shape, Hq 9 / Hk 3 / D 64) at several contexts on 1 and 2 kvarn threads, with a gap
between calls as inside a model: none (back to back), a 1.5 ms sleep, or ~1.3 ms of torch matmuls on 2
threads (its OpenMP workers then spin or sleep as after a layer's projections). Median per call, us."""
import statistics, sys, time
import numpy as np
import torch
import kvarn

torch.set_num_threads(2)
rng = np.random.default_rng(0)
W = torch.randn(576, 1536)
x = torch.randn(1, 576)
def torch_gap():
    t = time.perf_counter()
    while time.perf_counter() - t < 0.0013:
        x @ W
gaps = {"none": lambda: None, "sleep": lambda: time.sleep(0.0015), "torch": torch_gap}
for ctx in [int(c) for c in sys.argv[1].split(",")]:
    cache = kvarn.KVCache(3, 64)
    cache.append(rng.standard_normal((3, ctx, 64), dtype=np.float32), rng.standard_normal((3, ctx, 64), dtype=np.float32))
    q = rng.standard_normal((9, 64)).astype(np.float32)
    res = {}
    for rnd in range(3):
        for gname, gap in gaps.items():
            for kt in (1, 2):
                ts = []
                for _ in range(60):
                    gap()
                    t = time.perf_counter()
                    kvarn.attend(q, cache, num_threads=kt)
                    ts.append(time.perf_counter() - t)
                res.setdefault((gname, kt), []).append(statistics.median(ts) * 1e6)
    line = ", ".join(f"{g}: 1T {min(res[(g, 1)]):.0f} / 2T {min(res[(g, 2)]):.0f} us" for g in gaps)
    print(f"ctx {ctx}: {line}", flush=True)
