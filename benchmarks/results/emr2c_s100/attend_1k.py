"""kvarn.attend alone at the SmolLM2 shape (Hq 9, Hk 3, D 64), 1K tokens, 1 and 2 threads: min of 5 blocks of 2,000 calls."""
import time, numpy as np, kvarn
rng = np.random.default_rng(0)
c = kvarn.KVCache(3, 64)
c.append(rng.standard_normal((3, 1024, 64)).astype(np.float16), rng.standard_normal((3, 1024, 64)).astype(np.float16))
q = rng.standard_normal((9, 64)).astype(np.float32)
for threads in (1, 2, 1, 2):
    kvarn.set_num_threads(threads)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(2000):
            kvarn.attend(q, c)
        best = min(best, (time.perf_counter() - t) / 2000)
    print(f"{threads} thread(s): {best * 1e6:.1f} us per call ({kvarn.active_isa()}, {kvarn.score_mode()})")
