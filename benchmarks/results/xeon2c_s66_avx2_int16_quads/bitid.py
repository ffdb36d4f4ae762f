"""Bit-identity check of the avx2 int16 value path: `python bitid.py save out.npz` on the base build,
`python bitid.py compare base.npz` on the new one (PYTHONPATH picks the build). Every case's output
(float32) must be array_equal. Seeds: zlib.crc32 of the case repr."""
import sys, zlib, itertools, time
import numpy as np
import kvarn
from kvarn import _native

PRESETS = ["k4v2_g128", "k4v2_g64", "k2v2_g128", "k4v4_g128"]
DIMS = [16, 32, 48, 64, 80, 112, 128, 240, 256, 272, 1024]
GROUPS = [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (2, 9), (1, 12), (3, 4)]  # (Hk, Hq/Hk)
LENGTHS = [5, 131, 300]
STYLES = ["plain", "peaky", "spread"]  # query scale / per-token value scale: the weights' spread


def case_out(preset, D, hk, r, n, style):
    rng = np.random.default_rng(zlib.crc32(repr((preset, D, hk, r, n, style)).encode()))
    K = rng.standard_normal((hk, n, D)).astype(np.float32)
    V = rng.standard_normal((hk, n, D)).astype(np.float32)
    q = rng.standard_normal((hk * r, D)).astype(np.float32)
    if style == "peaky":
        q *= 4.0
        K[:, :, :4] *= 8.0
    elif style == "spread":
        V *= np.exp(rng.standard_normal((hk, n, 1)) * 1.5).astype(np.float32)
        V += 3.0
    c = kvarn.KVCache(hk, D, preset=preset)
    c.append(K, V)
    return q, c


def main():
    what, path = sys.argv[1], sys.argv[2]
    kvarn.set_isa("avx2")
    _native.set_score_mode("int16")
    res = {}
    t0 = time.time()
    for preset, D, (hk, r), n, style in itertools.product(PRESETS, DIMS, GROUPS, LENGTHS, STYLES):
        if D == 1024 and (style != "plain" or n == 131):
            continue
        q, c = case_out(preset, D, hk, r, n, style)
        for vnni in (True, False):
            _native.set_vnni(vnni)
            assert _native.score_mode() == "int16" and kvarn.active_isa() == "avx2"
            res[repr((preset, D, hk, r, n, style, vnni))] = kvarn.attend(q, c)
    print(f"{len(res)} outputs in {time.time() - t0:.1f} s")
    if what == "save":
        np.savez(path, **res)
        return
    base = np.load(path)
    assert sorted(base.files) == sorted(res), "case lists differ"
    bad = [k for k in res if not np.array_equal(base[k], res[k])]
    nonfinite = sum(1 for k in res if not np.isfinite(res[k]).all())
    for k in bad[:20]:
        print("DIFFERS", k, float(np.abs(base[k] - res[k]).max()))
    print(f"{len(res) - len(bad)}/{len(res)} bit-identical; {nonfinite} with non-finite values")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
