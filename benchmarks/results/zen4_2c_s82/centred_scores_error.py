"""Forty-second session: the integer score modes' extra error before and after scoring centred codes (c - 7.5).
Run once per build (each in its own process, since both are the package kvarn):

    python benchmarks/results/zen4_2c_s82/centred_scores_error.py SITE_DIR [label]

1. The shipped SmolLM2 sample: k4v2 cache of each captured layer's 896 tokens; queries of every 7th position
   (128 positions x 9 query heads per layer) attend the whole cache; relative L2 (per query head) of the int16 and
   int8 outputs from the float path's over the same cache.
2. The twenty-second session's score-growth case (s62_int8_score_growth.py: keys whose channel scales spread
   lognormally, sigma 1; queries scaled up): relative L2 from the float64 oracle over the dequantised cache.
3. docs/simd.md's table case: a 4K-token k4v2 cache of random data, Hq 32, Hk 8, D 128 (eight draws of cache and
   query): relative L2 of each mode from the float64 oracle over the dequantised cache.
One thread; the active ISA is the machine's default unless KVARN_ISA says otherwise."""
import pathlib
import sys

sys.path.insert(0, sys.argv[1])
import numpy as np
import kvarn
from kvarn.demo import load_sample

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
import oracle  # noqa: E402

label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
kvarn.set_num_threads(1)
print(f"[{label}] isa {kvarn.active_isa()}, kvarn from {pathlib.Path(kvarn.__file__).parent}")

s = load_sample()
k_all, v_all, q_all = s["k"], s["v"], s["q"]
L, hk, n, d = k_all.shape
errs = {"int16": [], "int8": []}
for layer in range(L):
    cache = kvarn.KVCache(hk, d, "k4v2_g128")
    cache.append(k_all[layer].astype(np.float32), v_all[layer].astype(np.float32))
    for pos in range(0, n, 7):
        q = np.ascontiguousarray(q_all[layer][:, pos].astype(np.float32))
        outs = {}
        for mode in ("float", "int16", "int8"):
            kvarn.set_score_mode(mode)
            outs[mode] = kvarn.attend(q, cache).astype(np.float64)
        for mode in errs:
            errs[mode].append(np.linalg.norm(outs[mode] - outs["float"], axis=-1)
                              / np.linalg.norm(outs["float"], axis=-1))
kvarn.set_score_mode("int16")
for mode, e in errs.items():
    e = np.concatenate(e)
    print(f"[{label}] SmolLM2 sample, {mode} vs float: mean {e.mean():.2e}, median {np.median(e):.2e}, "
          f"p99 {np.quantile(e, 0.99):.2e}, max {e.max():.2e} ({e.size} query heads)")

rng = np.random.default_rng(0)
H, D, n = 1, 64, 512
chan = np.exp(rng.normal(0, 1, D))
k = (rng.standard_normal((H, n, D)) * chan).astype(np.float32)
v = rng.standard_normal((H, n, D)).astype(np.float32)
c = kvarn.KVCache(H, D)
c.append(k, v)
K, V = c.dequantize()
print(f"[{label}] q scale | max|score| | rel L2 error of attend:  float    int16    int8")
for qs in [0.3, 1, 3, 10, 30, 100]:
    q = (rng.standard_normal((16, D)) * qs).astype(np.float32)
    r = oracle.attention(q, K, V, 1 / np.sqrt(D))
    smax = np.abs(K[0] @ q.T / np.sqrt(D)).max()
    e = []
    for mode in ["float", "int16", "int8"]:
        kvarn.set_score_mode(mode)
        e.append(np.linalg.norm(c.attend(q) - r) / np.linalg.norm(r))
    print(f"[{label}] {qs:7} | {smax:10.1f} | {e[0]:24.1e} {e[1]:8.1e} {e[2]:8.1e}")
kvarn.set_score_mode("int16")

rng = np.random.default_rng(1)
rows = {m: [] for m in ("float", "int16", "int8")}
for _ in range(8):
    c = kvarn.KVCache(8, 128)
    c.append(rng.standard_normal((8, 4096, 128)).astype(np.float32), rng.standard_normal((8, 4096, 128)).astype(np.float32))
    K, V = c.dequantize()
    q = rng.standard_normal((32, 128)).astype(np.float32)
    r = oracle.attention(q, K, V, 1 / np.sqrt(128))
    for mode in rows:
        kvarn.set_score_mode(mode)
        rows[mode].append(np.linalg.norm(c.attend(q) - r) / np.linalg.norm(r))
kvarn.set_score_mode("int16")
print(f"[{label}] 4K random k4v2, Hq 32 Hk 8 D 128, rel L2 from float64 (mean of 8): "
      + ", ".join(f"{m} {np.mean(v):.1e}" for m, v in rows.items()))
