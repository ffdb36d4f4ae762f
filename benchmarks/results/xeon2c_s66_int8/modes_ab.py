# int8 / int16 per-round time ratios in one process, one thread, k4v2_g128 at 32K: avx512 (VNNI) and avx2
# (AVX-VNNI on and off). Prints each configuration's rounds and median.
import numpy as np, kvarn, time, sys, os
from kvarn import _native
kvarn.set_num_threads(1)
print("kvarn from", os.path.dirname(kvarn.__file__), "load", os.getloadavg())
for Hk, D, Hq in ((8, 128, 32), (3, 64, 9)):
    rng = np.random.default_rng(0)
    n = 32768
    c = kvarn.KVCache(Hk, D, preset="k4v2_g128")
    for i in range(0, n, 4096):
        c.append(rng.standard_normal((Hk, 4096, D)).astype(np.float32), rng.standard_normal((Hk, 4096, D)).astype(np.float32))
    q = rng.standard_normal((Hq, D)).astype(np.float32)
    for isa, vnni in (("avx512", True), ("avx2", True), ("avx2", False)):
        kvarn.set_isa(isa); _native.set_vnni(vnni)
        def t(mode, reps=15):
            _native.set_score_mode(mode); kvarn.attend(q, c)
            best = 1e9
            for _ in range(reps):
                t0 = time.perf_counter(); kvarn.attend(q, c); best = min(best, time.perf_counter() - t0)
            return best
        r16, r8 = [], []
        for _ in range(6):
            r16.append(t("int16")); r8.append(t("int8"))
        ratio = np.array(r8) / np.array(r16)
        print(f"Hq{Hq} Hk{Hk} D{D} {isa} vnni={vnni}: int16 {min(r16)*1e3:.3f} ms, int8 {min(r8)*1e3:.3f} ms, int8/int16 median {np.median(ratio):.3f} rounds {np.round(ratio, 3).tolist()}")
    _native.set_vnni(True)
