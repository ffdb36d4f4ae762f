# Forty-third session: cold vs warm kvarn decode calls (test_decode_cold's scheme): M layer copies of the kvarn and fp16
# caches (M = COLD_MB, default 256 MiB, / one fp16 copy) read in turn, fp16 then kvarn per layer; then kvarn warm (one copy, back to back).
# Env: SHAPE=hk,hq,D CTX TH R (rounds). Prints per-call minima and medians in ms.
import os, sys, time
import numpy as np
import kvarn
from kvarn import FP16Cache, attend_fp16_batch
hk, hq, d = (int(x) for x in os.environ.get("SHAPE", "3,9,64").split(","))
ctx = int(os.environ.get("CTX", "32768")); th = int(os.environ.get("TH", "2")); rounds = int(os.environ.get("R", "30"))
rng = np.random.default_rng(ctx)
k = rng.standard_normal((hk, ctx, d), dtype=np.float32); k[..., :4] *= 8.0
k = k.astype(np.float16); v = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
cache = kvarn.KVCache(hk, d); cache.append(k, v)
f16 = FP16Cache(hk, d, capacity=ctx); f16.append(k, v)
q = rng.standard_normal((1, hq, d), dtype=np.float32)
layers = max(1, -(-(int(os.environ.get("COLD_MB", "256")) << 20) // (2 * hk * ctx * d * 2)))
kvs = [cache.copy() for _ in range(layers)]; f16s = [f16.copy() for _ in range(layers)]
tk, tf = [], []
for r in range(rounds + 1):
    for kc, fc in zip(kvs, f16s):
        t = time.perf_counter(); attend_fp16_batch(q, [fc], num_threads=th); t1 = time.perf_counter()
        kvarn.attend_batch(q, [kc], num_threads=th); t2 = time.perf_counter()
        if r: tf.append(t1 - t); tk.append(t2 - t1)
tw = []
for _ in range(rounds * layers):
    t = time.perf_counter(); kvarn.attend_batch(q, [kvs[0]], num_threads=th); tw.append(time.perf_counter() - t)
ms = lambda a, f: 1e3 * f(np.array(a))
print(f"layers {layers} cold kvarn min {ms(tk, np.min):.4f} med {ms(tk, np.median):.4f} | fp16 min {ms(tf, np.min):.4f} "
      f"med {ms(tf, np.median):.4f} | ratio {min(tf)/min(tk):.3f} | warm kvarn min {ms(tw, np.min):.4f} med {ms(tw, np.median):.4f}")
