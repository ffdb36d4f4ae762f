# Records of real-ish k4v2 tiles (Gaussian keys with channel scales) for the harness: 1 KV head, 16 tiles.
import numpy as np, kvarn, sys
rng = np.random.default_rng(1)
for d in (64, 128):
    n = 128 * 17
    k = (rng.standard_normal((1, n, d)) * rng.uniform(0.2, 3, d)).astype(np.float16)
    v = rng.standard_normal((1, n, d)).astype(np.float16)
    c = kvarn.KVCache(1, d); c.append(k, v)
    p = c.to_parts()
    rec = np.ascontiguousarray(p["records"])
    print(d, rec.shape, rec.dtype)
    rec.tofile(f"rec{d}.bin")
    k.tofile(f"k{d}.bin"); v.tofile(f"v{d}.bin")
