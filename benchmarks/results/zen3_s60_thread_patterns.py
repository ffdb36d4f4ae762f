# Twentieth session: one kvarn.attend call at 1 and 2 native threads in three call patterns (back to back; 2 ms idle
# before each call; a torch matmul before each call, as inside a model). Output: zen3_s60_thread_patterns.log.
# t1 vs t2 per call at small sizes, three call patterns: back-to-back; 2 ms idle before each call (kvarn's helper
# sleeps after 200 us); a torch matmul between calls (as inside a model).
import time, sys, numpy as np, kvarn, torch
torch.set_num_threads(2)
rng = np.random.default_rng(0)
x = torch.randn(64, 576); w = torch.randn(576, 1536)
def series(fn, pattern, n=300):
    ts = []
    for _ in range(n):
        if pattern == "idle": time.sleep(0.002)
        elif pattern == "torch": (x @ w).sum()
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return np.median(ts) * 1e6
shapes = [(9, 3, 64, n) for n in (256, 512, 1024, 2048, 4096)] + [(32, 8, 128, n) for n in (256, 1024, 4096)]
for (Hq, Hk, D, ctx) in shapes:
    k = rng.standard_normal((Hk, ctx, D)).astype(np.float32); v = rng.standard_normal((Hk, ctx, D)).astype(np.float32)
    c = kvarn.KVCache(Hk, D); c.append(k, v)
    q = rng.standard_normal((Hq, D)).astype(np.float32)
    row = []
    for pattern in ("b2b", "idle", "torch"):
        r = {th: [] for th in (1, 2)}
        for rep in range(3):
            for th in (1, 2):
                r[th].append(series(lambda: kvarn.attend(q, c, num_threads=th), pattern))
        row.append(f"{pattern}: t1 {np.median(r[1]):6.1f} t2 {np.median(r[2]):6.1f}")
    print(f"Hq{Hq} Hk{Hk} D{D} ctx {ctx:5d} | " + " | ".join(row), flush=True)
