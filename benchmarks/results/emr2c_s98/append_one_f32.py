"""Fifty-eighth session: a one-token KVCache.append on its own (3 kv heads x 64, ~1K tokens held), median of 3000."""
import time, statistics, sys, cProfile, pstats
import numpy as np, kvarn, torch
from kvarn.integrations.transformers import _to_numpy
c = kvarn.KVCache(3, 64)
rng = np.random.default_rng(0)
c.append(rng.standard_normal((3, 1000, 64)).astype(np.float16), rng.standard_normal((3, 1000, 64)).astype(np.float16))
x = torch.randn(1, 1, 3*64).view(1, 1, 3, 64).transpose(1, 2)  # [B, Hk, 1, D] non-contiguous like a model's
k = _to_numpy(x, keep_f16=True); v = k.copy()
print(k.dtype, k.shape, k.strides, k.flags.c_contiguous)
ts = []
for _ in range(3000):
    t = time.perf_counter(); c.append(k[0][:, 0:1], v[0][:, 0:1]); ts.append(time.perf_counter() - t)
    if len(c) > 1100: c.truncate(c.truncation_point(1000))
print("append one fp32 token median us %.1f" % (1e6 * statistics.median(ts)))
