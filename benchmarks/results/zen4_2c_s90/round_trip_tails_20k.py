"""Round-trip relative error tails of quantize_tile on test_round_trip_relative_error_bounded's inputs."""
import sys, time, numpy as np, kvarn
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "tests"))
from conftest import kv_like
PRESETS = ["k4v2_g128", "k4v4_g128", "k4v2_g64", "k4v4_g64", "k2v2_g128"]  # tests/test_quantize.py
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
print("presets", PRESETS, "seeds per (kbits/vbits, d):", N)
res = {}
t0 = time.time()
for d in (16, 48, 64, 112, 128):
    for preset in PRESETS:
        p = kvarn.PRESETS[preset]
        ke, ve = [], []
        for seed in range(N):
            rng = np.random.default_rng(seed)
            mag = float(np.exp(rng.uniform(np.log(1e-3), np.log(1e3))))
            heads = 1
            k = (kv_like(rng, (heads, p.group, d)) * mag).astype(np.float32)
            v = (rng.standard_normal((heads, p.group, d)) * mag).astype(np.float32)
            kh, vh = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
            ke.append(np.linalg.norm(kh - k) / np.linalg.norm(k)); ve.append(np.linalg.norm(vh - v) / np.linalg.norm(v))
        ke, ve = np.array(ke), np.array(ve)
        print(f"d {d:3d} {preset:10s} k: p99.9 {np.quantile(ke, .999):.4f} max {ke.max():.4f} (seed {ke.argmax()})  "
              f"v: p99.9 {np.quantile(ve, .999):.4f} max {ve.max():.4f}  [{time.time() - t0:.0f} s]", flush=True)
