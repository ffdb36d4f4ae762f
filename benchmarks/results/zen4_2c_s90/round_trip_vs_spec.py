"""Native round-trip error against the SPEC oracle's (float64, unrounded scale vectors) on the test's inputs."""
import sys, numpy as np, kvarn
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "tests"))
import oracle
from conftest import kv_like
PRESETS = ["k4v2_g128", "k4v4_g128", "k4v2_g64", "k4v4_g64", "k2v2_g128"]
def oracle_hat(x, bits, keys):
    xr = oracle.rotate(x.astype(np.float64))
    m = oracle.quantize_matrix(xr.T if keys else xr, bits)
    rec = (m["codes"] * m["a"][:, None] + m["z"][:, None]) * m["col"][None, :]
    return oracle.rotate(rec.T if keys else rec)
worst = 0
rng0 = np.random.default_rng(7)
rows = []
for i in range(3000):
    seed = int(rng0.integers(2**32)); preset = PRESETS[i % 5]; d = [16, 48, 64, 112, 128][(i // 5) % 5]
    p = kvarn.PRESETS[preset]
    rng = np.random.default_rng(seed)
    mag = float(np.exp(rng.uniform(np.log(1e-3), np.log(1e3))))
    k = (kv_like(rng, (1, p.group, d)) * mag).astype(np.float32)
    v = (rng.standard_normal((1, p.group, d)) * mag).astype(np.float32)
    kh, vh = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
    for x, xh, bits, keys in ((k, kh, p.kbits, True), (v, vh, p.vbits, False)):
        n = np.linalg.norm(x)
        e_nat = np.linalg.norm(xh - x) / n
        e_or = np.linalg.norm(oracle_hat(x[0], bits, keys) - x[0]) / n
        rows.append((abs(e_nat / e_or - 1), mag, d, preset, keys, seed))
r = np.array([x[0] for x in rows])
print("|native/oracle - 1| of the relative round-trip error: median %.2e p99 %.2e max %.2e" % (np.median(r), np.quantile(r, .99), r.max()))
for x in sorted(rows, key=lambda t: -t[0])[:5]:
    print("  ", x)
