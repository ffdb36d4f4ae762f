"""Forty-second session: one draw's int8 relative L2 error (avx512 and avx2) from float64 over the dequantised cache,
as test_int_score_error_measured draws them, over 320 seeds, and the means of 8 draws resampled (the test bounds such a
mean): the twenty-sixth session's xeon2c_s66_int8/int8_err_seeds.py for a given build.

    python benchmarks/results/zen4_2c_s82/int8_err_seeds.py SITE_DIR LABEL"""
import pathlib
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
import numpy as np
import kvarn
from kvarn import _native
import test_simd as T

label = sys.argv[2]
errs = {"avx512": [], "avx2": []}
for seed in range(320):
    rng = np.random.default_rng(seed)
    c = T._cache(rng, "k4v2_g128", 8, 128, 4096 + 77)
    q = rng.standard_normal((32, 128)).astype(np.float32)
    ref = T.reference(q, *c.dequantize(), 1 / np.sqrt(128))
    _native.set_score_mode("int8")
    for isa in errs:
        kvarn.set_isa(isa)
        out = kvarn.attend(q, c)
        errs[isa].append(np.linalg.norm(out - ref) / np.linalg.norm(ref))
_native.set_score_mode("int16")
for isa, e in errs.items():
    e = np.array(e)
    means = np.random.default_rng(1).choice(e, (100000, 8)).mean(1)
    print(f"[{label}] {isa}: one draw median {np.median(e):.4f} p90 {np.percentile(e, 90):.4f} max {e.max():.4f}; "
          f"means of 8: p0.02 {np.percentile(means, 0.02):.4f} median {np.median(means):.4f} "
          f"p99.98 {np.percentile(means, 99.98):.4f}")
