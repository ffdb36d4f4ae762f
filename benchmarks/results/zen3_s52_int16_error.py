# Seventeenth session: the int16 score mode's deviation from the exact float path (max |int16 - float| / max |float|)
# found by a review; run on the Zen 3 box: PYTHONPATH=<install> python zen3_s52_int16_error.py
import os, numpy as np, kvarn
rng = np.random.default_rng(6)
Hk, Hq, D, N = 2, 6, 64, 700
k = rng.standard_normal((Hk, N, D)).astype(np.float32); v = rng.standard_normal((Hk, N, D)).astype(np.float32)
c = kvarn.KVCache(Hk, D, sink_tokens=37); c.append(k, v)
def both(q):
    kvarn.set_score_mode("float"); f = c.attend(q)
    kvarn.set_score_mode("int16"); i = c.attend(q)
    return np.abs(f - i).max() / np.abs(f).max()
print("ISA", kvarn.active_isa())
for qs in (1.0, 8.0, 30.0):
    print("random q x%-4g rel diff int16 vs float: %.2e" % (qs, both(rng.standard_normal((Hq, D)).astype(np.float32) * qs)))
e = np.zeros((Hq, D), np.float32); e[:, 0] = 200; e[:, 1:] = rng.standard_normal((Hq, D - 1)) * 0.5
print("q with one dominant rotated component: %.2e" % both(kvarn.hadamard(e).astype(np.float32)))
d = np.load(os.path.join(os.path.dirname(kvarn.__file__), "data", "smollm2_verne_sample.npz"))
w = {}
for layer in range(3):
    c = kvarn.KVCache(3, 64); c.append(d["k"][layer], d["v"][layer])
    for pos in range(0, 896, 23):
        for qs in (1.0, 4.0):
            w[qs] = max(w.get(qs, 0), both(d["q"][layer][:, pos]* qs))
print("embedded SmolLM2 sample, worst over 117 queries: x1 %.2e, x4 %.2e" % (w[1.0], w[4.0]))
