"""Quantiser time per (tile, kv head), k4v2_g128, D 128, fp16 input, one thread (python quantize_one_core.py ISA N SECONDS):
the min over repeated calls quantising N random tiles; the fifty-ninth session ran it under perf record (RESULTS §2)."""
import sys, time, os, numpy as np
import kvarn
from kvarn import _ops
isa = sys.argv[1] if len(sys.argv) > 1 else None
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 3
if isa: kvarn.set_isa(isa)
rng = np.random.default_rng(0)
k = rng.standard_normal((n, 128, 128)).astype(np.float16)
v = rng.standard_normal((n, 128, 128)).astype(np.float16)
preset = kvarn.PRESETS[kvarn.DEFAULT_PRESET]
f = lambda: _ops.quantize_tiles_native(k, v, preset, _ops.SINKHORN_ITERS, 1)
f()
best = 1e9; t_end = time.time() + secs; calls = 0
while time.time() < t_end:
    t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t); calls += 1
print(f"{kvarn.active_isa() if hasattr(kvarn,'active_isa') else isa}: {best/n*1e6:.2f} us per (tile, kv head), {calls} calls")
