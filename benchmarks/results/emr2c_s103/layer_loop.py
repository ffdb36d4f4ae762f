"""KVarNLayer's decode step outside a model: 30 layers (SmolLM2: Hq 9, Hk 3, D 64), 1K tokens each,
update + attend_pending per layer with torch tensors, as the model calls them. Reports per layer:
the whole update + attend_pending, the native attend call inside, and the rest (host work + append)."""
import os, statistics, sys, time
import numpy as np
import torch
import kvarn
from kvarn import _ops
from kvarn.integrations.transformers import KVarNLayer

ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
kvarn.set_num_threads(int(os.environ.get("KT", "1")))
L, Hq, Hk, D = 30, 9, 3, 64
rng = np.random.default_rng(0)
layers = [KVarNLayer() for _ in range(L)]
with torch.inference_mode():
    for layer in layers:
        k = torch.from_numpy(rng.standard_normal((1, Hk, ctx, D), dtype=np.float32))
        v = torch.from_numpy(rng.standard_normal((1, Hk, ctx, D), dtype=np.float32))
        layer.update(k, v)
        layer.store_prefill(None)
native = [0.0]
fn = _ops._native.attend
def timed(*a):
    t = time.perf_counter()
    try:
        return fn(*a)
    finally:
        native[0] += time.perf_counter() - t
_ops._native.attend = timed
ks = [torch.from_numpy(rng.standard_normal((1, Hk, 1, D), dtype=np.float32)) for _ in range(8)]
qs = [torch.from_numpy(rng.standard_normal((1, Hq, 1, D), dtype=np.float32)) for _ in range(8)]
tot, nat = [], []
import cProfile
prof = cProfile.Profile() if os.environ.get('PROF') else None
if prof: prof.enable()
with torch.inference_mode():
    for s in range(steps):
        native[0] = 0.0
        t = time.perf_counter()
        for layer in layers:
            layer.update(ks[s % 8], ks[(s + 1) % 8])
            layer.attend_pending(qs[s % 8], None, 0.125)
        tot.append(time.perf_counter() - t)
        nat.append(native[0])
        if (s + 1) % 64 == 0:  # keep the context from running into a tile completion's cost: drop 64 tokens
            for layer in layers:
                layer.crop(-64)
if prof:
    prof.disable(); prof.dump_stats('/tmp/ll.prof')
per = lambda xs: statistics.median(xs) / L * 1e6
print(f"ctx {ctx}: per layer {per(tot):.1f} us (native attend {per(nat):.1f}, rest {statistics.median([a - b for a, b in zip(tot, nat)]) / L * 1e6:.1f})")
