# Outputs of kvarn.attend for many shapes/presets/threads/score modes, saved to an .npz (run once per build, then compare).
import sys, numpy as np, kvarn
out = {}
rng = np.random.default_rng(7)
cases = []
for preset in ["k4v2_g128", "k4v2_g64", "k2v2_g128", "k4v4_g128"]:
    for hk, hq, D in [(8, 32, 128), (3, 9, 64), (1, 4, 16), (2, 2, 48), (1, 8, 256), (2, 6, 80), (1, 1, 1024)]:
        for n in [300, 1000]:
            cases.append((preset, hk, hq, D, n))
for preset, hk, hq, D, n in cases:
    c = kvarn.KVCache(hk, D, preset=preset, sink_tokens=64)
    k = rng.standard_normal((hk, n, D)).astype(np.float32); k[..., :3] *= 6
    v = (rng.standard_normal((hk, n, D)) * rng.uniform(0.2, 3, (1, n, 1))).astype(np.float32)
    c.append(k, v)
    q = rng.standard_normal((hq, D)).astype(np.float32) * 2
    for mode in ["int16", "float", "int8"]:
        kvarn.set_score_mode(mode)
        for th in [1, 2]:
            out[f"{preset}_{hk}_{hq}_{D}_{n}_{mode}_{th}"] = kvarn.attend(q, c, num_threads=th)
kvarn.set_score_mode("int16")
np.savez(sys.argv[1], **out)
print(len(out), "outputs", kvarn.active_isa())
