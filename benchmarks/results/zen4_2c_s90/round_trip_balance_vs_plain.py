"""Tail seeds' key errors: native, SPEC oracle (tests/oracle.round_trip), and plain per-channel RTN of the rotated
keys (no balancing), with the balancing's imbalance and scale ranges."""
import numpy as np, kvarn
from round_trip_tails import tail_inputs
import oracle  # tests/, on the path round_trip_tails puts it

for seed, preset, d in ((2093, "k2v2_g128", 16), (15066, "k4v2_g128", 16), (3984, "k2v2_g128", 64), (3984, "k4v2_g128", 64)):
    p = kvarn.PRESETS[preset]
    mag, k, v = tail_inputs(seed, preset, d)
    kh, _ = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
    ko, _ = oracle.round_trip(k[0], v[0], p.kbits, p.vbits)
    n = np.linalg.norm(k[0])
    print(seed, preset, "mag %.3g" % mag, "native %.4f oracle %.4f" % (np.linalg.norm(kh[0] - k[0]) / n, np.linalg.norm(ko - k[0]) / n))
    k_rot = oracle.rotate(k[0].astype(np.float64)).T
    kq = oracle.quantize_matrix(k_rot, p.kbits)
    print("  imbalance", kq["imbalance"], "identity", kq["imbalance_identity"], "r range", kq["r"].min(), kq["r"].max(), "c range", kq["c"].min(), kq["c"].max())
    codes, scale, lo, _ = oracle.rtn(k_rot, p.kbits)  # without balancing
    kp = oracle.rotate((codes * scale[:, None] + lo[:, None]).T)
    print("  plain RTN (no balance) %.4f" % (np.linalg.norm(kp - k[0]) / n))
