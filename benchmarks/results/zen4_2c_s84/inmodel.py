# Decompose kvarn's per-layer time inside SmolLM2 decoding (8K context): attend_pending in total, the native attend,
# the appends, checkpoints; then the same native attend over the same caches outside the model, cold (30 layers in
# turn) and warm (one layer repeated).
# The "wake=update" blocks of inmodel.log: a build with variant_wake_threads.patch applied, KVARN_EXP_WAKE=update.
import os, sys, time, statistics as st, collections
import numpy as np, torch
import kvarn
from kvarn import _ops
from kvarn.integrations import assets
from kvarn.integrations.transformers import KVarNCache, KVarNLayer, cache_kwargs, restore_attention
ctx = int(os.environ.get("CTX", "8000")); steps = int(os.environ.get("STEPS", "24")); th = int(os.environ.get("TH", "2"))
tth = int(os.environ.get("TTH", th)); torch.set_num_threads(tth); kvarn.set_num_threads(th)
model, tok = assets.load_model("smollm2-135m")
ids = assets.verne_token_ids(tok, ctx)
acc = collections.defaultdict(float); on = [False]
def wrap(owner, name, key):
    fn = getattr(owner, name)
    def timed(*a, **k):
        t = time.perf_counter()
        try: return fn(*a, **k)
        finally:
            if on[0]: acc[key] += time.perf_counter() - t
    setattr(owner, name, timed)
native = _ops._native
wrap(KVarNLayer, "attend_pending", "attend_pending"); wrap(KVarNLayer, "update", "update")
wrap(native, "attend", "native.attend"); wrap(kvarn.KVCache, "append", "append"); wrap(kvarn.KVCache, "checkpoint", "checkpoint")
wrap(kvarn.KVCache, "_native_parts", "_native_parts")
cache = KVarNCache(model.config); kw = cache_kwargs(model, cache)
per = collections.defaultdict(list); fwd = []
with torch.inference_mode():
    nxt = model(torch.tensor([ids]), use_cache=True, **kw).logits[:, -1:].argmax(-1)
    for s in range(steps):
        acc.clear(); on[0] = True; t = time.perf_counter()
        nxt = model(nxt, use_cache=True, **kw).logits[:, -1:].argmax(-1)
        fwd.append(time.perf_counter() - t); on[0] = False
        for k_, v_ in acc.items(): per[k_].append(v_)
print(f"torch {tth} threads {th} isa {kvarn.active_isa()} ctx {ctx}: forward median {1e3*st.median(fwd):.2f} ms")
for k_, v_ in per.items(): print(f"  {k_:16s} per token {1e3*st.median(v_):.3f} ms  per layer {1e3*st.median(v_)/30:.4f} ms")
restore_attention(model)
layers = [l for l in cache.kvarn_layers]
rng = np.random.default_rng(0); q = rng.standard_normal((1, 9, 64), dtype=np.float32) * 0.125
parts = [[c._native_parts() for c in l.caches] for l in layers]
out = np.empty_like(q)
cold, warm = [], []
for r in range(40):
    for p in parts:
        t = time.perf_counter(); native.attend(p, q, 1.0, out, th); cold.append(time.perf_counter() - t)
for r in range(600):
    t = time.perf_counter(); native.attend(parts[0], q, 1.0, out, th); warm.append(time.perf_counter() - t)
print(f"  outside the model: native.attend cold (30 layers in turn) median {1e3*st.median(cold):.4f} min {1e3*min(cold):.4f} | warm median {1e3*st.median(warm):.4f} min {1e3*min(warm):.4f} ms")
