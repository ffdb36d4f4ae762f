# Forty-second session: eight seconds of quantize_tiles_native on 8 fp16 tiles (D 128, avx512, one thread) under
# perf record; quantiser_perf.txt has the report and the hottest loop's disassembly (the .so has no symbols: the
# loop is weighted_column_std_block<64> of native/cpu/quantize_simd.inc, recognisable by its mul / fma / add per vector).
#   PYTHONPATH=SITE perf record -o perf_q.data python quantiser_perf_loop.py; perf report -i perf_q.data --sort symbol
import sys, time, numpy as np, kvarn
from kvarn import _ops
pre = kvarn.PRESETS["k4v2_g128"]; kvarn.set_isa("avx512")
rng = np.random.default_rng(0)
k = rng.standard_normal((8, 128, 128), dtype=np.float32).astype(np.float16)
v = rng.standard_normal((8, 128, 128), dtype=np.float32).astype(np.float16)
t0 = time.perf_counter()
while time.perf_counter() - t0 < 8:
    _ops.quantize_tiles_native(k, v, pre, _ops.SINKHORN_ITERS, 1)
