"""How many kvarn threads pay for an attend call that comes alone, after torch work on all cores (a model's
projections between layers: three fp32 matvecs over 4096 x 4096 weights, torch on every core), against the same
call back to back. argv[1]: the site folder; argv[2:]: kvarn thread counts. Per shape (headline Hq 32 / Hk 8 /
D 128, SmolLM2's Hq 9 / Hk 3 / D 64) and context, the median and minimum in ms. Data for a pool rule
("an isolated small call runs on the caller alone"), thirtieth session."""
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, torch, kvarn

counts = [int(a) for a in sys.argv[2:]]
torch.set_num_threads(kvarn.get_num_threads())
rng = np.random.default_rng(0)
w = [torch.randn(4096, 4096) for _ in range(3)]
x = torch.randn(1, 4096)
med = lambda a: sorted(a)[len(a) // 2] * 1e3  # noqa: E731
for hq, hk, d in ((32, 8, 128), (9, 3, 64)):
    for ctx in (1024, 4096, 32768):
        c = kvarn.KVCache(hk, d)
        c.append(rng.standard_normal((hk, ctx, d)).astype(np.float16), rng.standard_normal((hk, ctx, d)).astype(np.float16))
        q = rng.standard_normal((hq, d)).astype(np.float32)
        row = []
        for t in counts:
            kvarn.set_num_threads(t)
            for _ in range(10):
                kvarn.attend(q, c)
            b2b = []
            for _ in range(100 if ctx < 32768 else 30):
                t0 = time.perf_counter(); kvarn.attend(q, c); b2b.append(time.perf_counter() - t0)
            att = []
            for _ in range(60 if ctx < 32768 else 20):
                for m in w:
                    y = x @ m
                t0 = time.perf_counter(); kvarn.attend(q, c); att.append(time.perf_counter() - t0)
            row.append(f"{t}T b2b {med(b2b):.3f} / after torch {med(att):.3f} (min {min(att)*1e3:.3f})")
        print(f"hq{hq} hk{hk} d{d} ctx {ctx}: " + "; ".join(row), flush=True)
