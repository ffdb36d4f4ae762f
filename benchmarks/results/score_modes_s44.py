"""Score-mode speed for docs/simd.md: Hq 32, Hk 8, D 128, k4v2, 16K tokens, 1 thread, batch 1, best ISA; min of
interleaved rounds (each round times every mode once, 20 calls each)."""
import time, numpy as np, kvarn
rng = np.random.default_rng(0)
kvarn.set_num_threads(1)
c = kvarn.KVCache(num_kv_heads=8, head_dim=128)
n = 16384
c.append(rng.standard_normal((8, n, 128)).astype(np.float16), rng.standard_normal((8, n, 128)).astype(np.float16))
q = rng.standard_normal((32, 128)).astype(np.float32)
modes = ["float", "int16", "int8"]
best = {m: 1e9 for m in modes}
for r in range(15):
    for m in modes:
        kvarn.set_score_mode(m)
        kvarn.attend(q, c)
        t = time.perf_counter()
        for _ in range(20):
            kvarn.attend(q, c)
        best[m] = min(best[m], (time.perf_counter() - t) / 20)
print(kvarn.active_isa(), {m: f"{best[m]*1e3:.3f} ms" for m in modes}, {m: f"{best['float']/best[m]:.2f}x" for m in modes})
