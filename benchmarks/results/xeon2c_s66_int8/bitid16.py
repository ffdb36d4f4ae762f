# int16 (default) outputs must be bit-identical to the base build's: argv[1] save|compare
import numpy as np, kvarn, sys, pickle, zlib
from kvarn import _native
cases = [(p, hk, D, hq, n) for p in ("k4v2_g128", "k4v2_g64", "k2v2_g128", "k4v4_g128") for (hk, D, hq, n) in
         [(2, 128, 8, 677), (3, 64, 9, 600), (1, 16, 3, 400), (1, 48, 4, 700), (2, 80, 6, 350), (1, 256, 5, 500),
          (1, 272, 2, 300), (1, 1024, 2, 250), (2, 112, 10, 390), (1, 240, 4, 333), (2, 32, 16, 1000)]]
res = {}
for case in cases:
    p, hk, D, hq, n = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    c = kvarn.KVCache(hk, D, preset=p)
    c.append(rng.standard_normal((hk, n, D)).astype(np.float32) * 3, rng.standard_normal((hk, n, D)).astype(np.float32))
    q = (rng.standard_normal((hq, D)) * 2).astype(np.float32)
    for isa in ("avx512", "avx2"):
        kvarn.set_isa(isa)
        for vnni in (True, False):
            _native.set_vnni(vnni)
            _native.set_score_mode("int16")
            res[case, isa, vnni] = kvarn.attend(q, c)
    _native.set_vnni(True)
if sys.argv[1] == "save":
    pickle.dump(res, open("/work/scratch/s26/int16_ref.pkl", "wb")); print("saved", len(res))
else:
    ref = pickle.load(open("/work/scratch/s26/int16_ref.pkl", "rb"))
    bad = [k for k in res if not np.array_equal(res[k], ref[k])]
    print(f"{len(res) - len(bad)} of {len(res)} bit-identical to the base build", bad[:5])
