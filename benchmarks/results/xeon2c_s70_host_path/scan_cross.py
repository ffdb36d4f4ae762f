import time, numpy as np
from kvarn import _ops
rng = np.random.default_rng(0)
for n in (256, 1024, 2048, 4096, 8192, 16384, 65536):
    x = rng.standard_normal((1, n // 64, 64)).astype(np.float32)
    N = max(50, 1_000_000 // n)
    f = lambda: _ops.as_float_array(x, "k", fp16_range=True)
    best = 1e9
    for r in range(7):
        t = time.perf_counter()
        for _ in range(N): f()
        best = min(best, (time.perf_counter() - t) / N)
    print(f"{n:6d} {best*1e6:8.2f} us")
