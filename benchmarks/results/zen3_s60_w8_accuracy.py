# Twentieth session: relative L2 error of kvarn.attend in a score mode ("float" / "int16"; KVARN_EXP_W8=1 with
# zen3_s60_w8_values.patch applied: 8-bit value weights) on the shipped SmolLM2 sample, against a float64
# reference over the same dequantised cache, and the quantisation error itself. Output: zen3_s60_w8_values.log.
import os, sys, numpy as np, kvarn
from kvarn import _native
from kvarn.demo import load_sample
def ref(q, K, V, scale, G):
    # q [Hq, D], K/V [Hk, n, D]
    Hq, Hk = q.shape[0], K.shape[0]; g = Hq // Hk
    out = np.empty(q.shape)
    for h in range(Hq):
        k = K[h // g].astype(np.float64); v = V[h // g].astype(np.float64)
        s = k @ q[h].astype(np.float64) * scale; p = np.exp(s - s.max()); out[h] = p @ v / p.sum()
    return out
mode = sys.argv[1]
s = load_sample()
k_all, v_all, q_all = s["k"], s["v"], s["q"]
print({k: np.shape(v) for k, v in s.items() if k != "meta"})
errs, qerrs = [], []
for L in range(k_all.shape[0]):
    k, v, qs = k_all[L], v_all[L], q_all[L]
    Hk, n, D = k.shape
    c = kvarn.KVCache(Hk, D); c.append(k, v)
    K, V = c.dequantize()
    for qi in range(0, qs.shape[1] if qs.ndim == 3 else 1, max(1, qs.shape[1] // 8)):
        q = qs[:, qi] if qs.ndim == 3 else qs
        r = ref(q, K, V, 1 / np.sqrt(D), 128)
        r0 = ref(q, k, v, 1 / np.sqrt(D), 128)
        _native.set_score_mode(mode)
        o = kvarn.attend(q, c)
        errs.append(np.linalg.norm(o - r) / np.linalg.norm(r)); qerrs.append(np.linalg.norm(r - r0) / np.linalg.norm(r0))
print(mode, os.environ.get("KVARN_EXP_W8"), "mode err vs dequant ref: mean %.3g max %.3g; quantisation err mean %.3g" % (np.mean(errs), np.max(errs), np.mean(qerrs)))
