import sys, numpy as np, timeit
sys.path.insert(0, sys.argv[1])
from kvarn import _native, _ops
rng = np.random.default_rng(0)
for H, D in ((3, 64), (8, 128)):
    x = rng.standard_normal((H, 1, D)).astype(np.float32)
    buf = np.zeros((H, 300, D), np.float16)
    o = buf[:, 5:6].view(np.uint16)
    t1 = min(timeit.repeat(lambda: _native.scan_f32(x, o, 65504.0), number=5000, repeat=7)) / 5000
    t2 = min(timeit.repeat(lambda: _native.scan_f32(x), number=5000, repeat=7)) / 5000
    t3 = min(timeit.repeat(lambda: _ops.store_tokens_f16(x, "k", buf[:, 5:6]), number=5000, repeat=7)) / 5000
    print(f"{H}x{D}: scan+store {t1*1e6:.3f} us, scan only {t2*1e6:.3f} us, store_tokens_f16 {t3*1e6:.3f} us")
