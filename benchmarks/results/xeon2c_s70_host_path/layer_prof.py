import os, time, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, numpy as np, kvarn
from kvarn import _ops, _native
import kvarn.cache as kc
from kvarn.integrations import assets
import kvarn.integrations.transformers as kt_mod
from kvarn.integrations.transformers import KVarNCache
kt = int(sys.argv[1]); torch.set_num_threads(2); kvarn.set_num_threads(kt)
model, tok = assets.load_model("smollm2-135m")
ids = tok(assets.verne_text())["input_ids"][:int(os.environ.get("CTX", 1024))]
acc = {}
pc = time.perf_counter
def wrap(obj, name, key=None):
    key = key or name
    orig = getattr(obj, name, None)
    if orig is None: return
    def timed(*a, **k):
        t = pc(); r = orig(*a, **k); d = pc() - t
        s = acc.setdefault(key, [0.0, 0]); s[0] += d; s[1] += 1; return r
    setattr(obj, name, timed)
wrap(_native, "attend", "native.attend")
wrap(_ops, "run_attend"); kc._ops = _ops; wrap(kt_mod, "run_attend"); wrap(kt_mod, "check_queries"); wrap(kt_mod, "check_scale")
wrap(_ops, "check_queries"); wrap(_ops, "check_kv"); wrap(_ops, "as_float_array"); wrap(_ops, "check_scale")
wrap(kc, "attend_batch"); wrap(kvarn, "attend_batch")
wrap(kc.KVCache, "append"); wrap(kc.KVCache, "_native_parts"); wrap(kc.KVCache, "_publish"); wrap(kc.KVCache, "checkpoint")
wrap(kc.KVCache, "_settle_frozen_tail"); wrap(kc, "store_tokens_f16"); wrap(kc, "resolve_threads"); wrap(kc.KVCache, "_writable_tail"); wrap(kc.KVCache, "_stage_full_tail"); wrap(kc.KVCache, "_append"); wrap(_native, "scan_f32")
wrap(kt_mod.KVarNLayer, "attend_pending"); wrap(kt_mod.KVarNLayer, "update"); wrap(kt_mod, "_to_numpy")
wrap(kt_mod, "kvarn_attention")
cache = KVarNCache(model.config)
with torch.no_grad():
    out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    nxt = out.logits[0, -1].argmax().view(1, 1)
    def step(n):
        global nxt
        for _ in range(n):
            o = model(nxt, past_key_values=cache, use_cache=True)
            nxt = o.logits[0, -1].argmax().view(1, 1)
    step(3); acc.clear()
    ts = []
    N = 40
    for _ in range(N):
        t = time.perf_counter(); step(1); ts.append(time.perf_counter() - t)
    ts.sort()
print(f"kvarn threads {kt}: step median {ts[N//2]*1e3:.2f} ms min {ts[0]*1e3:.2f}")
for k, (s, n) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
    print(f"  {k:22s} {s/N*1e3:7.3f} ms/step  {s/max(n,1)*1e6:7.1f} us/call  calls/step {n/N:.0f}")
