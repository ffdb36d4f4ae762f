"""Quantiser time per (tile, KV head), one thread: the best of repeated calls on 8 fp16 tiles (in L2, as a
completing append's tiles are), per ISA and head_dim. python qtile.py [seconds per row]"""
import sys, time
import numpy as np
import kvarn
from kvarn import _ops

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
pre = kvarn.PRESETS["k4v2_g128"]
for isa in ("avx512", "avx2"):
    if isa not in kvarn.available_isas():
        continue
    kvarn.set_isa(isa)
    for d in (128, 64):
        rng = np.random.default_rng(0)
        k = rng.standard_normal((8, 128, d), dtype=np.float32).astype(np.float16)
        v = rng.standard_normal((8, 128, d), dtype=np.float32).astype(np.float16)
        best, calls, t0 = 1e9, 0, time.perf_counter()
        while time.perf_counter() - t0 < secs:
            t = time.perf_counter()
            _ops.quantize_tiles_native(k, v, pre, _ops.SINKHORN_ITERS, 1)
            best = min(best, time.perf_counter() - t)
            calls += 1
        print(f"{isa} D={d} best {best / 8 * 1e6:.1f} us per (tile, KV head), {calls} calls")
