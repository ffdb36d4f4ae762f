"""Fifty-eighth session: per-layer host time split of KVarNCache's CPU decode step on SmolLM2 (30 layers, 60 steps after a
prompt of argv[1] tokens): update + attend_pending, the native attend call, KVCache.append and the pieces, medians per
layer. PREWAKE=1 calls the tried kvarn._ops.prewake() (prewake_tried.diff, not landed) at each decode update; TT, KT:
torch and kvarn threads (default 2). The timers nest (layer holds the rest)."""
import sys, time, statistics
import torch
import kvarn, kvarn._ops as ops
from kvarn.integrations import assets
from kvarn.integrations.transformers import KVarNCache, cache_kwargs, KVarNLayer
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
import os; torch.set_num_threads(int(os.environ.get("TT","2"))); kvarn.set_num_threads(int(os.environ.get("KT","2")))
model, tok = assets.load_model("smollm2-135m")
ids = assets.verne_token_ids(tok, ctx)
cache = KVarNCache(model.config)
kw = cache_kwargs(model, cache)
acc = {k: 0.0 for k in ["layer","native","append","run_attend","to_numpy","checkq","take","ckpt","upd","prewake"]}
def wrap(owner, name, key):
    fn = getattr(owner, name)
    def timed(*a, **k):
        t = time.perf_counter()
        try: return fn(*a, **k)
        finally: acc[key] += time.perf_counter() - t
    setattr(owner, name, timed)
from transformers.cache_utils import Cache
import os
if os.environ.get("PREWAKE"):
    _u = KVarNLayer.update
    def upd_pw(self, *a, **k):
        if self.cumulative_length: ops.prewake()
        return _u(self, *a, **k)
    KVarNLayer.update = upd_pw
    wrap(ops, "prewake", "prewake")
wrap(KVarNCache, "update", "layer"); wrap(KVarNLayer, "attend_pending", "layer")
wrap(ops._native, "attend", "native")
wrap(kvarn.KVCache, "append", "append")
import kvarn.integrations.transformers as T
wrap(ops, "run_attend", "run_attend"); wrap(T, "_to_numpy", "to_numpy"); wrap(T, "check_step_queries", "checkq"); wrap(KVarNLayer, "_take_pending", "take"); wrap(kvarn.KVCache, "checkpoint", "ckpt"); wrap(T.DynamicLayer if False else KVarNLayer, "update", "upd")
with torch.inference_mode():
    logits = model(torch.tensor([ids]), use_cache=True, **kw).logits
    nxt = logits[:, -1:].argmax(-1)
    rows = []
    for _ in range(60):
        for key in acc: acc[key] = 0.0
        t = time.perf_counter()
        logits = model(nxt, use_cache=True, **kw).logits
        rows.append((time.perf_counter() - t, dict(acc)))
        nxt = logits[:, -1:].argmax(-1)
med = lambda key: 1e6 * statistics.median(r[1][key] for r in rows) / 30
print(" ".join(f"{k} {med(k):.1f}" for k in acc)); print(f"ctx {ctx}: step {1e3*statistics.median(r[0] for r in rows):.2f} ms; per layer: update+attend_pending {med('layer'):.1f} us, native attend {med('native'):.1f} us, KVCache.append {med('append'):.1f} us")
