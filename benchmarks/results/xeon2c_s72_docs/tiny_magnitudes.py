"""README "Design decisions", bullet "Tiny magnitudes": k4v2 reconstruction error of Gaussian tiles
(128 tokens x D 64) whose rms is 1, 1e-3, ..., 1e-8, measured on the current code.

Command (from the repository root, with the build of the current code):
    PYTHONPATH=/work/scratch/site_h32 python benchmarks/results/xeon2c_s72_docs/tiny_magnitudes.py \
        > benchmarks/results/xeon2c_s72_docs/tiny_magnitudes.log

Inputs: per seed s (0..19) K = Zk / rms(Zk) * rms and V = Zv / rms(Zv) * rms (Z standard normal,
float64, numpy default_rng(s) drawing Zk then Zv), then cast to float32: that float32 tile is "the input".
Two paths:
  f32   kvarn.quantize_tile(K32, V32, "k4v2_g128") -> kvarn.dequantize_tile: quantises exactly the
        float32 values (no fp16 rounding of the tile).
  cache kvarn.KVCache(1, 64, "k4v2_g128", sink_tokens=0).append(K32[None], V32[None]) (128 tokens: one
        tile, quantised at fill from the tokens rounded to fp16), record read back with cache.records[0],
        wrapped as kvarn.Tile and decoded with kvarn.dequantize_tile.
Errors are against the float32 input (for the cache path also against its fp16 rounding, which is what the
cache quantises): rel = rms(X^ - X) / rms(X), abs = rms(X^ - X), maxabs = max |X^ - X|. Median [min, max] over 20 seeds.
Also shown: the error of the fp16 rounding of the input alone, the float64 SPEC oracle (tests/oracle.py) with
its scale vectors rounded to fp16 (as a record stores them) from the same float32 input, and how many of
a record's fp16 scale entries are subnormal (0 < |x| < 6.1e-5) or zero.
"""
import os
import sys

import numpy as np

import kvarn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
import oracle  # noqa: E402

G, D = 128, 64
PRESET = "k4v2_g128"
SEEDS = range(20)
RMS = [1.0, 1e-3, 1e-4, 1e-5, 3e-6, 1e-6, 3e-7, 1e-7, 3e-8, 1e-8]  # 3e-x: extra points between the asked ones
FP16_MIN_NORMAL = float(np.finfo(np.float16).tiny)  # 6.1e-5


def rms(x):
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def oracle_decode(k, v):
    """Float64 SPEC (oracle.quantize_tile) with the folded vectors rounded to fp16, decoded in float64."""
    q = oracle.quantize_tile(k, v, 4, 2)
    f16 = lambda x: np.asarray(x).astype(np.float16).astype(np.float64)
    kq, vq = q["k"], q["v"]
    k_rot = ((kq["codes"] * f16(kq["a"])[:, None] + f16(kq["z"])[:, None]) * f16(kq["col"])[None, :]).T
    v_rot = (vq["codes"] * f16(vq["a"])[:, None] + f16(vq["z"])[:, None]) * f16(vq["col"])[None, :]
    return oracle.rotate(k_rot), oracle.rotate(v_rot)


def scale_counts(tile):
    f = tile.fields()
    out = {}
    for part, names in (("k", ("ka", "kz", "kt")), ("v", ("va", "vz", "vc"))):
        vals = np.concatenate([np.abs(f[n][0].astype(np.float64)) for n in names])
        out[part] = (int(np.sum((vals > 0) & (vals < FP16_MIN_NORMAL))), int(np.sum(vals == 0)), vals.size)
    return out


def main():
    print(f"kvarn {kvarn.__version__} from {os.path.dirname(kvarn.__file__)}, ISA {kvarn.active_isa()}, preset {PRESET}, "
          f"G {G}, D {D}, {len(SEEDS)} seeds")
    rows = {}
    for s in RMS:
        acc = {}
        def put(key, val):
            acc.setdefault(key, []).append(val)
        for seed in SEEDS:
            rng = np.random.default_rng(seed)
            zk, zv = rng.standard_normal((G, D)), rng.standard_normal((G, D))
            k32 = (zk / rms(zk) * s).astype(np.float32)
            v32 = (zv / rms(zv) * s).astype(np.float32)
            x = {"k": k32.astype(np.float64), "v": v32.astype(np.float64)}
            x16 = {p: x[p].astype(np.float16).astype(np.float64) for p in x}
            # path 1: quantize_tile on float32
            tile = kvarn.quantize_tile(k32, v32, PRESET)
            kh, vh = kvarn.dequantize_tile(tile)
            dec = {"k": kh.astype(np.float64), "v": vh.astype(np.float64)}
            # path 2: KVCache (fp16 tokens), sink 0, 128 tokens
            cache = kvarn.KVCache(1, D, PRESET, sink_tokens=0)
            cache.append(k32[None], v32[None])
            assert cache.num_tiles == 1 and cache.tail_len == 0 and cache.sink_len == 0
            ctile = kvarn.Tile(np.array(cache.records[0]), PRESET, D)
            ck, cv = kvarn.dequantize_tile(ctile)
            cdec = {"k": ck[0].astype(np.float64), "v": cv[0].astype(np.float64)}
            # the cache's record equals quantize_tile of the fp16-rounded tile?
            t16 = kvarn.quantize_tile(k32.astype(np.float16), v32.astype(np.float16), PRESET)
            put("cache_eq_qt_f16", bool(np.array_equal(t16.records, ctile.records)))
            odec = dict(zip("kv", oracle_decode(x["k"], x["v"])))
            for p in "kv":
                r = rms(x[p])
                put(f"{p}_f32_rel", rms(dec[p] - x[p]) / r)
                put(f"{p}_f32_max", float(np.abs(dec[p] - x[p]).max()))
                put(f"{p}_f32_abs", rms(dec[p] - x[p]))
                put(f"{p}_cache_abs", rms(cdec[p] - x[p]))
                put(f"{p}_cache_rel", rms(cdec[p] - x[p]) / r)
                put(f"{p}_cache_max", float(np.abs(cdec[p] - x[p]).max()))
                put(f"{p}_cache_rel16", rms(cdec[p] - x16[p]) / rms(x16[p]) if rms(x16[p]) > 0 else np.inf)
                put(f"{p}_f16in_rel", rms(x16[p] - x[p]) / r)
                put(f"{p}_oracle_rel", rms(odec[p] - x[p]) / r)
                put(f"{p}_rms", r)
            for name, t in (("f32", tile), ("cache", ctile)):
                for p, (sub, zero, n) in scale_counts(t).items():
                    put(f"{p}_{name}_subnormal", sub)
                    put(f"{p}_{name}_zero", zero)
                    put(f"{p}_nscales", n)
        rows[s] = acc

    def fmt(vals, f="{:.3g}"):
        a = np.asarray(vals, np.float64)
        return f"{f.format(np.median(a))} [{f.format(a.min())}, {f.format(a.max())}]"

    for p, name in (("k", "KEYS"), ("v", "VALUES")):
        print()
        print(f"{name} (k4v2: keys 4-bit per channel, values 2-bit per token): median [min, max] over seeds")
        print("rel = rms(X^ - X)/rms(X) against the float32 input; abs = rms(X^ - X); maxabs = max |X^ - X|; "
              "fp16's smallest step 2^-24 = 5.96e-8")
        hdr = (f"{'rms':>6} | {'f32 path rel':>26} | {'f32 path abs':>29} | {'f32 path maxabs':>29} | {'cache path rel':>26} | "
               f"{'cache path abs':>29} | {'cache path maxabs':>29} | {'cache rel vs fp16(X)':>26} | {'fp16(X) alone rel':>26} | {'oracle64+fp16 vec rel':>26}")
        print(hdr)
        print("-" * len(hdr))
        for s in RMS:
            a = rows[s]
            print(f"{s:>6.0e} | {fmt(a[p + '_f32_rel']):>26} | {fmt(a[p + '_f32_abs']):>29} | {fmt(a[p + '_f32_max']):>29} | "
                  f"{fmt(a[p + '_cache_rel']):>26} | {fmt(a[p + '_cache_abs']):>29} | {fmt(a[p + '_cache_max']):>29} | {fmt(a[p + '_cache_rel16']):>26} | {fmt(a[p + '_f16in_rel']):>26} | "
                  f"{fmt(a[p + '_oracle_rel']):>26}")
        print()
        n = rows[RMS[0]][p + "_nscales"][0]
        print(f"{name}: fp16 scale entries of the record ({n}: {'ka, kz [64], kt [128]' if p == 'k' else 'va, vz [128], vc [64]'}) "
              "subnormal (0 < |x| < 6.1e-5) / zero, median [min, max] over seeds")
        print(f"{'rms':>6} | {'f32 subnormal':>18} | {'f32 zero':>18} | {'cache subnormal':>18} | {'cache zero':>18}")
        for s in RMS:
            a = rows[s]
            f = "{:.0f}"
            print(f"{s:>6.0e} | {fmt(a[p + '_f32_subnormal'], f):>18} | {fmt(a[p + '_f32_zero'], f):>18} | "
                  f"{fmt(a[p + '_cache_subnormal'], f):>18} | {fmt(a[p + '_cache_zero'], f):>18}")
    print()
    print("cache record == quantize_tile(fp16-rounded tile) record, seeds agreeing per rms: " +
          ", ".join(f"{s:.0e}: {sum(rows[s]['cache_eq_qt_f16'])}/{len(SEEDS)}" for s in RMS))


if __name__ == "__main__":
    main()
