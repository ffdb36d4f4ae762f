"""docs/simd.md "Why int16 is the default": on the shipped SmolLM2 sample (the last position of its tokens, every
captured layer), how far k4v2 moves the attention output from exact attention (L2, relative), and how far the int16
score mode moves it from the float path over the same cache. Per layer; every query head of the last position.

    python benchmarks/results/xeon2c_s72_docs/int16_vs_quantisation.py [site-dir]
"""
import sys
if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
import numpy as np
import kvarn
from kvarn import baselines
from kvarn.demo import load_sample

s = load_sample()
k_all, v_all, q_all = s["k"], s["v"], s["q"]
L, hk, n, d = k_all.shape
print(f"sample: {s.get('meta', {}).get('source', '?')}; {L} layers, {hk} kv heads, {q_all.shape[1]} q heads, {n} tokens, D {d}")
print(f"isa {kvarn.active_isa()}, default score mode {kvarn.score_mode()}")
for layer in range(L):
    k = k_all[layer].astype(np.float32); v = v_all[layer].astype(np.float32)
    cache = kvarn.KVCache(hk, d, "k4v2_g128"); cache.append(k, v)
    q = np.ascontiguousarray(q_all[layer][:, -1].astype(np.float32))
    ref = baselines.attention_numpy(q, k, v, 1 / np.sqrt(d), dtype=np.float64)
    outs = {}
    for mode in ("float", "int16", "int8"):
        kvarn.set_score_mode(mode)
        outs[mode] = kvarn.attend(q, cache).astype(np.float64)
    kvarn.set_score_mode("int16")
    rel = lambda a, b: np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)  # per query head
    qe, e16, e8 = rel(outs["float"], ref), rel(outs["int16"], outs["float"]), rel(outs["int8"], outs["float"])
    print(f"layer {layer}: k4v2 vs exact {qe.min():.3f}-{qe.max():.3f} (mean {qe.mean():.3f}); int16 vs float "
          f"{e16.min():.1e}-{e16.max():.1e} (mean {e16.mean():.1e}); int8 vs float {e8.min():.1e}-{e8.max():.1e} (mean {e8.mean():.1e})")
