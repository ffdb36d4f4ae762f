"""Round-trip relative error tails of quantize_tile on test_round_trip_relative_error_bounded's inputs (heads 1,
magnitude log-uniform over the test's range), seeds [start, start + N): keys per (kbits, group, d), values per
(vbits, group, d). tail_inputs() is the input of one seed, shared by this directory's other round_trip_* scripts."""
import sys, time, pathlib, numpy as np, kvarn
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
from conftest import kv_like

PRESETS = ["k4v2_g128", "k4v4_g128", "k4v2_g64", "k4v4_g64", "k2v2_g128"]  # tests/test_quantize.py


def tail_inputs(seed, preset, d):
    """(magnitude, k, v) [1, G, d] float32 of one seed: kv_like keys and Gaussian values times a log-uniform magnitude."""
    p = kvarn.PRESETS[preset]
    rng = np.random.default_rng(seed)
    mag = float(np.exp(rng.uniform(np.log(1e-3), np.log(1e3))))
    k = (kv_like(rng, (1, p.group, d)) * mag).astype(np.float32)
    v = (rng.standard_normal((1, p.group, d)) * mag).astype(np.float32)
    return mag, k, v


def main(start, N, dims):
    print(f"kvarn {kvarn.__version__} isa {kvarn.active_isa()}; seeds {start}..{start + N - 1}; dims {dims}")
    t0 = time.time()
    for d in dims:
        for preset in PRESETS:
            p = kvarn.PRESETS[preset]
            ke, ve = np.empty(N), np.empty(N)
            for i in range(N):
                _, k, v = tail_inputs(start + i, preset, d)
                kh, vh = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
                ke[i] = np.linalg.norm(kh - k) / np.linalg.norm(k); ve[i] = np.linalg.norm(vh - v) / np.linalg.norm(v)
            print(f"d {d:3d} {preset:10s} k{p.kbits}: p99.9 {np.quantile(ke, .999):.4f} p99.99 {np.quantile(ke, .9999):.4f} "
                  f"max {ke.max():.4f} (seed {start + ke.argmax()})  v{p.vbits}: p99.9 {np.quantile(ve, .999):.4f} "
                  f"max {ve.max():.4f} (seed {start + ve.argmax()})  [{time.time() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")])
