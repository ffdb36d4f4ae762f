# Fifteenth session: the cost of a speculative-decoding step around a rollback (output: zen3_s50_speculative_step.log).
# One speculative-decoding step of one layer: checkpoint, 4 draft tokens one by one, rollback, drop the
# checkpoint, 2 accepted tokens one by one (headline shape: 8 KV heads, D 128, 32K context; the tail
# stays inside one tile). 41 rounds of 20 steps: median, minimum and quartiles of the per-step time.
import time, numpy as np, kvarn
rng = np.random.default_rng(0)
H, D = 8, 128
c = kvarn.KVCache(H, D)
base = 32768 + 40
c.append(rng.standard_normal((H, base, D)).astype(np.float32), rng.standard_normal((H, base, D)).astype(np.float32))
tok = [rng.standard_normal((H, 1, D)).astype(np.float32) for _ in range(6)]
times = []
for rep in range(41):
    c.truncate(base)
    t = time.perf_counter()
    for i in range(20):
        p = c.checkpoint()
        for j in range(4): c.append(tok[j], tok[j])
        c.rollback(p); del p
        for j in range(2): c.append(tok[4 + j], tok[4 + j])
    times.append((time.perf_counter() - t) / 20)
print(f"{np.median(times) * 1e6:.1f} us per speculative step (min {min(times) * 1e6:.1f}, quartiles {np.percentile(times, 25) * 1e6:.0f} / {np.percentile(times, 75) * 1e6:.0f})")
