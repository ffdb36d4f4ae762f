# One draw's int8 relative L2 error (avx512 and avx2) vs float64 over the dequantised cache, 320 seeds, as
# test_int_score_error_measured draws them; and means of 8 draws resampled.
import sys, numpy as np
sys.path.insert(0, "tests")  # run from the repository root
import test_simd as T, kvarn
from kvarn import _native
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
for isa, e in errs.items():
    e = np.array(e)
    means = np.random.default_rng(1).choice(e, (100000, 8)).mean(1)
    print(f"{isa}: median {np.median(e):.4f} p90 {np.percentile(e, 90):.4f} max {e.max():.4f}; means of 8: p99.98 {np.percentile(means, 99.98):.4f}, share >= 0.056: {(means >= 0.056).mean():.5f}")
