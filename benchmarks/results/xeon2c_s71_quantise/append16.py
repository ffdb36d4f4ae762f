import sys, numpy as np, time, timeit
sys.path.insert(0, sys.argv[1])
import kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
for H, D in ((3, 64), (8, 128)):
    for dt in (np.float32, np.float16):
        x = rng.standard_normal((H, 1, D)).astype(dt)
        c = kvarn.KVCache(H, D); y = rng.standard_normal((H, 1024 + 129, D)).astype(np.float16); c.append(y, y)
        best = 1e9
        for r in range(40):
            c.truncate(1024 + 129)
            t = time.perf_counter()
            for i in range(100): c.append(x, x)
            best = min(best, (time.perf_counter() - t) / 100)
        ck = min(timeit.repeat(lambda: _ops.check_kv(x, x, H, D), number=2000, repeat=5)) / 2000
        print(f"{H}x{D} {np.dtype(dt).name}: 1-token append {best*1e6:.2f} us, check_kv {ck*1e6:.2f} us")
