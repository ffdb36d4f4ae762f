import numpy as np, kvarn, time, sys
from kvarn import _native
rng = np.random.default_rng(0)
bad = 0
for preset, Hk, D, Hq, n in [("k4v2_g128", 8, 128, 32, 4096 + 77), ("k4v2_g128", 3, 64, 9, 1000), ("k2v2_g128", 2, 192, 10, 700),
                             ("k4v4_g64", 2, 256, 2, 333), ("k4v2_g64", 1, 256, 3, 200), ("k4v2_g128", 2, 128, 6, 600), ("k4v2_g128", 1, 128, 1, 600)]:
    c = kvarn.KVCache(Hk, D, preset=preset)
    c.append(rng.standard_normal((Hk, n, D)).astype(np.float32), rng.standard_normal((Hk, n, D)).astype(np.float32))
    q = rng.standard_normal((Hq, D)).astype(np.float32)
    for mode in ["int16", "int8"]:
        _native.set_score_mode(mode)
        _native.set_amx(False); a = kvarn.attend(q, c); assert not _native.amx()
        _native.set_amx(True); b = kvarn.attend(q, c); assert _native.amx()
        same = np.array_equal(a, b)
        bad += not same
        print(preset, Hk, D, Hq, n, mode, "identical" if same else f"DIFF max {np.abs(a-b).max():.3e} rel {np.linalg.norm(a-b)/np.linalg.norm(a):.3e}")
sys.exit(bad)
