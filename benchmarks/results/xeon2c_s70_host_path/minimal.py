import os, time, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, numpy as np, kvarn
from kvarn import _native
from kvarn.integrations import assets
import kvarn.integrations.transformers as kt_mod
from kvarn.integrations.transformers import KVarNCache
torch.set_num_threads(2); kvarn.set_num_threads(int(sys.argv[1]))
mode = sys.argv[2]
model, tok = assets.load_model("smollm2-135m")
ids = tok(assets.verne_text())["input_ids"][:int(os.environ.get("CTX", 1024))]
orig = kt_mod.KVarNLayer.attend_pending
def minimal(self, query, attention_mask, scaling):
    ks, vs = self._pending; self._pending = None
    k = ks.numpy(); v = vs.numpy(); q = query.numpy()
    c = self.caches[0]
    c.append(k[0], v[0])
    B, Hq, n, D = query.shape
    out_t = torch.empty((B, n, Hq, D)); out = out_t.numpy()
    _native.attend([c._native_parts()], np.ascontiguousarray(q[:, :, 0]), scaling, out[:, 0], 0)
    self.cumulative_length += 1
    return out_t
if mode == "minimal": kt_mod.KVarNLayer.attend_pending = minimal
cache = KVarNCache(model.config)
with torch.no_grad():
    out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    nxt = out.logits[0, -1].argmax().view(1, 1)
    def step(n):
        global nxt
        for _ in range(n):
            o = model(nxt, past_key_values=cache, use_cache=True)
            nxt = o.logits[0, -1].argmax().view(1, 1)
    step(3)
    ts = []
    for _ in range(60):
        t = time.perf_counter(); step(1); ts.append(time.perf_counter() - t)
    ts.sort()
print(f"{mode} kvarn threads {sys.argv[1]}: step median {ts[30]*1e3:.2f} ms min {ts[0]*1e3:.2f}")
