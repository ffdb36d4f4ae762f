"""Per-layer host work of KVarNCache's decode step inside SmolLM2-135M (1K context, 2 threads).
Times per decode step, summed over the 30 layers: KVarNLayer.update, attend_pending, and inside it
the native attend and KVCache._append_locked; host = attend_pending - native attend - append."""
import statistics, sys, time
import torch
import kvarn
from kvarn import _ops
from kvarn.cache import KVCache
from kvarn.integrations import assets
from kvarn.integrations.transformers import KVarNCache, KVarNLayer, cache_kwargs, restore_attention

ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 48
import os
torch.set_num_threads(2); kvarn.set_num_threads(int(os.environ.get("KT", "2")))
model, tok = assets.load_model("smollm2-135m")
ids = assets.verne_token_ids(tok, ctx)
acc = {}
def wrap(owner, name, key):
    fn = getattr(owner, name)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
    setattr(owner, name, timed)
wrap(KVarNLayer, "update", "update")
wrap(KVarNLayer, "attend_pending", "attend_pending")
wrap(_ops._native, "attend", "native_attend")
wrap(KVCache, "_append_locked", "append")
per = {k: [] for k in ("step", "update", "attend_pending", "native_attend", "append")}
for rnd in range(2):
    cache = KVarNCache(model.config)
    kw = cache_kwargs(model, cache)
    with torch.inference_mode():
        logits = model(torch.tensor([ids[:ctx]]), use_cache=True, **kw).logits
        nxt = logits[:, -1:].argmax(-1)
        for s in range(steps):
            acc.clear()
            t = time.perf_counter()
            logits = model(nxt, use_cache=True, **kw).logits
            per["step"].append(time.perf_counter() - t)
            for k in ("update", "attend_pending", "native_attend", "append"):
                per[k].append(acc.get(k, 0.0))
            nxt = logits[:, -1:].argmax(-1)
    restore_attention(model)
med = {k: statistics.median(v) * 1e3 for k, v in per.items()}
host = statistics.median([a - n - p for a, n, p in zip(per["attend_pending"], per["native_attend"], per["append"])]) * 1e3
print(f"ctx {ctx}: step {med['step']:.2f} ms; per step over 30 layers: update {med['update']:.3f}, attend_pending "
      f"{med['attend_pending']:.3f} (native attend {med['native_attend']:.3f}, append {med['append']:.3f}, "
      f"host rest {host:.3f}) ms")
