import sys, numpy as np, kvarn
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "tests"))
import oracle
from conftest import kv_like
for seed, preset, d in ((2093, "k2v2_g128", 16), (15066, "k4v2_g128", 16), (3984, "k2v2_g128", 64), (3984, "k4v2_g128", 64)):
    p = kvarn.PRESETS[preset]
    rng = np.random.default_rng(seed)
    mag = float(np.exp(rng.uniform(np.log(1e-3), np.log(1e3))))
    k = (kv_like(rng, (1, p.group, d)) * mag).astype(np.float32)
    v = (rng.standard_normal((1, p.group, d)) * mag).astype(np.float32)
    kh, vh = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
    kq = oracle.quantize_matrix(oracle.rotate(k[0].astype(np.float64)).T, p.kbits)
    krt = (kq["codes"] * kq["a"][:, None] + kq["z"][:, None]) * kq["col"][None, :]
    ko = oracle.rotate(krt.T)
    n = np.linalg.norm(k[0])
    print(seed, preset, "mag %.3g" % mag, "native %.4f oracle %.4f" % (np.linalg.norm(kh[0] - k[0]) / n, np.linalg.norm(ko - k[0]) / n))
    print("  imbalance", kq["imbalance"], "identity", kq["imbalance_identity"], "r range", kq["r"].min(), kq["r"].max(), "c range", kq["c"].min(), kq["c"].max())
    # without balancing: plain per-channel RTN of the rotated keys
    codes, scale, lo, _ = oracle.rtn(oracle.rotate(k[0].astype(np.float64)).T, p.kbits)
    kp = oracle.rotate((codes * scale[:, None] + lo[:, None]).T)
    print("  plain RTN (no balance) %.4f" % (np.linalg.norm(kp - k[0]) / n))
