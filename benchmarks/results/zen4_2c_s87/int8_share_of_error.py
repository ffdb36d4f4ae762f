"""How much the integer score modes add to the error the k4v2 cache already has, on the shipped SmolLM2 sample
(3 layers, 896 tokens, a query per position): at every position from 256 on, decode attention through a KVCache
appended up to that position, per score mode, against exact float64 attention over the unquantised K/V.
Prints per mode the mean / p99 / max of the relative L2 error, and per query how far int16 and int8 move it from
the float mode's (the kernel arithmetic's share of the total)."""
import sys
import numpy as np
import kvarn
from kvarn import baselines
from kvarn.demo import load_sample

preset = sys.argv[1] if len(sys.argv) > 1 else "k4v2_g128"
s = load_sample()
k_all, v_all, q_all = s["k"], s["v"], s["q"]
L, hk, n, d = k_all.shape
hq = q_all.shape[1]
modes = ("float", "int16", "int8")
err = {m: [] for m in modes}
moved = {m: [] for m in modes}  # |out_mode - out_float| / |ref|
for layer in range(L):
    k = k_all[layer].astype(np.float32)
    v = v_all[layer].astype(np.float32)
    cache = kvarn.KVCache(hk, d, preset)
    for pos in range(256, n):
        cache.append(k[:, len(cache) : pos + 1], v[:, len(cache) : pos + 1])
        q = np.ascontiguousarray(q_all[layer][:, pos].astype(np.float32))
        ref = baselines.attention_numpy(q, k[:, : pos + 1], v[:, : pos + 1], 1 / np.sqrt(d), dtype=np.float64)
        outs = {}
        for m in modes:
            kvarn.set_score_mode(m)
            outs[m] = kvarn.attend(q, cache).astype(np.float64)
        kvarn.set_score_mode("int16")
        rn = np.linalg.norm(ref, axis=-1)  # per query head
        for m in modes:
            err[m].extend(np.linalg.norm(outs[m] - ref, axis=-1) / rn)
            moved[m].extend(np.linalg.norm(outs[m] - outs["float"], axis=-1) / rn)
print(f"kvarn {kvarn.__version__}, ISA {kvarn.active_isa()}, preset {preset}, {L} layers x {n - 256} positions x {hq} "
      f"query heads = {len(err['float'])} queries")
for m in modes:
    e, mv = np.array(err[m]), np.array(moved[m])
    print(f"{m:6s} error vs exact: mean {e.mean():.4e}  p99 {np.quantile(e, 0.99):.4e}  max {e.max():.4e}   "
          f"moved from float: mean {mv.mean():.2e}  p99 {np.quantile(mv, 0.99):.2e}  max {mv.max():.2e}   "
          f"mean error / float's {e.mean() / np.mean(err['float']):.5f}")
