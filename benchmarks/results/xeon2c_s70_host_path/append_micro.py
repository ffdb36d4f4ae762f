"""Warm 1-token appends (tail path, float32 views of a model's [B, H, n, D]) and attend_batch, this build."""
import time, numpy as np, kvarn
kvarn.set_num_threads(1)
rng = np.random.default_rng(0)
for H, D, Hq in ((3, 64, 9), (8, 128, 32)):
    base = kvarn.KVCache(H, D)
    x = rng.standard_normal((H, 1024, D)).astype(np.float32); base.append(x, x)
    assert base.tail_len == 0
    toks = rng.standard_normal((1, H, 100, D)).astype(np.float32)
    q = rng.standard_normal((1, Hq, D)).astype(np.float32)
    best_a = best_q = 1e9
    for r in range(40):
        c = base.copy()
        t = time.perf_counter()
        for i in range(100):
            c.append(toks[0, :, i : i + 1], toks[0, :, i : i + 1])
        best_a = min(best_a, (time.perf_counter() - t) / 100)
        t = time.perf_counter()
        for i in range(100):
            kvarn.attend_batch(q, [c])
        best_q = min(best_q, (time.perf_counter() - t) / 100)
    print(f"H{H} D{D}: append 1 token {best_a*1e6:.2f} us, attend_batch (ctx 1124) {best_q*1e6:.2f} us")
