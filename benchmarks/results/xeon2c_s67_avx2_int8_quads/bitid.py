import sys, hashlib, itertools
sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn import _native
rng = np.random.default_rng(1)
out = []
for (hk, hq, D, preset, n) in [(3, 9, 64, "k4v2_g128", 1000), (8, 32, 128, "k4v2_g128", 2000), (2, 8, 80, "k4v2_g64", 700),
                               (1, 4, 240, "k4v2_g128", 900), (2, 6, 128, "k4v2_g64", 777), (1, 3, 16, "k4v2_g128", 600),
                               (2, 4, 48, "k4v2_g128", 500)]:
    c = kvarn.KVCache(hk, D, preset=preset)
    c.append(rng.standard_normal((hk, n, D)).astype(np.float32), rng.standard_normal((hk, n, D)).astype(np.float32))
    q = rng.standard_normal((hq, D)).astype(np.float32)
    for isa in ["avx2", "avx512"]:
        kvarn.set_isa(isa)
        for vnni in [True, False]:
            _native.set_vnni(vnni)
            for mode in ["int8", "int16"]:
                kvarn.set_score_mode(mode)
                for th in [1, 2]:
                    o = kvarn.attend(q, c, num_threads=th)
                    out.append(f"{hk},{hq},{D},{preset},{n} {isa} vnni={vnni} {mode} th={th} {hashlib.sha1(o.tobytes()).hexdigest()[:16]}")
print("\n".join(out))
