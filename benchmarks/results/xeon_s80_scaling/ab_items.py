"""One process of the items-per-thread A/B (device call s80b): argv[1] the site folder, argv[2] its label, argv[3] the
thread counts (comma-separated; default 4,8,16), argv[4] the contexts (default 4096,32768). Per shape, context and thread count, the minimum and median of
back-to-back kvarn attend calls (warm), one line each."""
import sys
import time

sys.path.insert(0, sys.argv[1])
import numpy as np  # noqa: E402

import kvarn  # noqa: E402

THREADS = [int(t) for t in sys.argv[3].split(",")] if len(sys.argv) > 3 else [4, 8, 16]
CONTEXTS = [int(c) for c in sys.argv[4].split(",")] if len(sys.argv) > 4 else [4096, 32768]

for hq, hk, d in ((32, 8, 128), (9, 3, 64)):
    for ctx in CONTEXTS:
        rng = np.random.default_rng(ctx)
        k = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
        v = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
        cache = kvarn.KVCache(hk, d)
        cache.append(k, v)
        q = rng.standard_normal((hq, d), dtype=np.float32)
        for t in THREADS:
            kvarn.set_num_threads(t)
            for _ in range(5):
                cache.attend(q)
            ts = []
            for _ in range(60 if ctx >= 32768 else 200):
                t0 = time.perf_counter()
                cache.attend(q)
                ts.append(time.perf_counter() - t0)
            ts.sort()
            print(f"{sys.argv[2]} hq{hq} d{d} ctx {ctx} threads {t}: min {ts[0] * 1e3:.4f} med {ts[len(ts) // 2] * 1e3:.4f} ms",
                  flush=True)
