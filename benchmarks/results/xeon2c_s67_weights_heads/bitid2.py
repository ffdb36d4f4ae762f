import sys, hashlib
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn import _native
rng = np.random.default_rng(2)
out = []
for preset in ["k4v2_g128", "k4v4_g128", "k4v2_g64", "k4v4_g64", "k2v2_g128", "k8v8_g128"]:
    for (hk, hq, D, n) in [(3, 9, 64, 900), (2, 8, 128, 700), (1, 6, 80, 500), (1, 1, 256, 400), (2, 4, 48, 333)]:
        c = kvarn.KVCache(hk, D, preset=preset)
        c.append(rng.standard_normal((hk, n, D)).astype(np.float32), rng.standard_normal((hk, n, D)).astype(np.float32))
        q = rng.standard_normal((hq, D)).astype(np.float32)
        for isa in ["avx512", "avx2"]:
            kvarn.set_isa(isa)
            for mode in ["float", "int16", "int8"]:
                kvarn.set_score_mode(mode)
                o = kvarn.attend(q, c, num_threads=1)
                out.append(f"{preset} {hk},{hq},{D},{n} {isa} {mode} {hashlib.sha1(o.tobytes()).hexdigest()[:16]}")
print("\n".join(out))
