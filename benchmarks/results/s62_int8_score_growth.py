"""Twenty-second session (from a report-only fuzz of the caches, h37): the opt-in int8 score mode's output error
grows with the attention scores' magnitude (keys with uneven channel scales, a peaked softmax), where int16 and
float stay small on the same cache and queries. Relative L2 against the float64 oracle over the cache's own
dequantised contents. Run (from the repository root, kvarn installed):
python benchmarks/results/s62_int8_score_growth.py > benchmarks/results/s62_int8_score_growth.log"""
import sys, numpy as np, kvarn
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "tests")); import oracle
kvarn.set_num_threads(1)
rng = np.random.default_rng(0)
H, D, n = 1, 64, 512
chan = np.exp(rng.normal(0, 1, D))                      # per-channel key scales (lognormal, sigma 1)
k = (rng.standard_normal((H, n, D)) * chan).astype(np.float32)
v = rng.standard_normal((H, n, D)).astype(np.float32)
c = kvarn.KVCache(H, D); c.append(k, v)
K, V = c.dequantize()
print("q scale | max|score| | rel L2 error of attend:  float    int16    int8")
for qs in [0.3, 1, 3, 10, 30, 100]:
    q = (rng.standard_normal((16, D)) * qs).astype(np.float32)
    r = oracle.attention(q, K, V, 1 / np.sqrt(D))
    s = np.abs(K[0] @ q.T / np.sqrt(D)).max()
    e = []
    for mode in ["float", "int16", "int8"]:
        kvarn.set_score_mode(mode)
        e.append(np.linalg.norm(c.attend(q) - r) / np.linalg.norm(r))
    print(f"{qs:7} | {s:10.1f} | {e[0]:24.1e} {e[1]:8.1e} {e[2]:8.1e}")
kvarn.set_score_mode("int16")
