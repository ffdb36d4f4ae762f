"""How often SPEC §3's balancing leaves a tile's reconstruction worse than plain per-row RTN of the rotated tile
(the identity candidate), on tests/test_quantize.py's round-trip inputs (kv_like keys, Gaussian values), float64
oracle. Per (bits, head_dim): share of tiles where balanced > plain, median and max of balanced / plain.
Arguments: seeds, and "mag" to scale each tile by a log-uniform magnitude in [1e-3, 1e3] as the test draws (SPEC §3's
clamps on the log scales make the balancing depend on the magnitude)."""
import sys, pathlib, numpy as np
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
import oracle
from conftest import kv_like
def rel(x, bits, keys, balance):
    xr = oracle.rotate(x)
    m = xr.T if keys else xr
    if balance:
        q = oracle.quantize_matrix(m, bits)
        rec = (q["codes"] * q["a"][:, None] + q["z"][:, None]) * q["col"][None, :]
    else:
        codes, scale, lo, _ = oracle.rtn(m, bits)
        rec = codes * scale[:, None] + lo[:, None]
    back = oracle.rotate(rec.T if keys else rec)
    return np.linalg.norm(back - x) / np.linalg.norm(x)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
MAG = len(sys.argv) > 2 and sys.argv[2] == "mag"
for d in (16, 64, 128):
    for bits in (2, 4):
        for keys in (True, False):
            r = []
            for seed in range(N):
                rng = np.random.default_rng(seed)
                mag = float(np.exp(rng.uniform(np.log(1e-3), np.log(1e3)))) if MAG else 1.0
                x = mag * kv_like(rng, (128, d)).astype(np.float64) if keys else mag * rng.standard_normal((128, d))
                r.append(rel(x, bits, keys, True) / rel(x, bits, keys, False))
            r = np.array(r)
            print(f"d {d:3d} {'keys' if keys else 'vals'} {bits}-bit: balanced worse in {np.mean(r > 1) * 100:5.1f} % "
                  f"of {N} tiles; balanced / plain median {np.median(r):.3f} max {r.max():.3f}", flush=True)
