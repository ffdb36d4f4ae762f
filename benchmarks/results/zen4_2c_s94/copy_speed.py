"""KVCache.copy() before (records copied) and after (records shared, copied at the copy's next tile), and a beam
search's per-step copies: a cache of n tokens copied, then one token appended to the copy (a decode step)."""
import time
import numpy as np
import kvarn

rng = np.random.default_rng(0)
for H, D, n in ((3, 64, 8192), (3, 64, 32768), (8, 128, 32768)):
    c = kvarn.KVCache(H, D)
    c.append(rng.standard_normal((H, n, D)).astype(np.float16), rng.standard_normal((H, n, D)).astype(np.float16))
    one = [rng.standard_normal((H, 1, D)).astype(np.float16) for _ in range(2)]
    best_copy = best_step = 1e9
    for _ in range(20):
        t0 = time.perf_counter(); d = c.copy(); t1 = time.perf_counter()
        d.append(*one); t2 = time.perf_counter()
        best_copy, best_step = min(best_copy, t1 - t0), min(best_step, t2 - t0)
    print(f"H {H} D {D} n {n}: copy {best_copy * 1e6:.1f} us, copy + one-token append {best_step * 1e6:.1f} us, "
          f"records {c.records.nbytes / 2**20:.1f} MiB", flush=True)
