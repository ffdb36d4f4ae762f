import os, time, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, numpy as np, kvarn
from kvarn import _ops
from kvarn.integrations import assets
from kvarn.integrations.transformers import KVarNCache
kt = int(sys.argv[1]); torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2); kvarn.set_num_threads(kt)
model, tok = assets.load_model("smollm2-135m")
ids = tok(assets.verne_text())["input_ids"][:int(os.environ.get("CTX", 1024))]
# time the native attend calls inside the step
orig = _ops.run_attend; acc = [0.0, 0]
def timed(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); acc[0] += time.perf_counter() - t; acc[1] += 1; return r
_ops.run_attend = timed
import kvarn.cache as kc
if hasattr(kc, "run_attend"): kc.run_attend = timed
import kvarn.integrations.transformers as kt_mod
if hasattr(kt_mod, "run_attend"): kt_mod.run_attend = timed  # imported by name since the thirtieth session
cache = KVarNCache(model.config)
with torch.no_grad():
    out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    nxt = out.logits[0, -1].argmax().view(1, 1)
    def step(n):
        global nxt
        for _ in range(n):
            o = model(nxt, past_key_values=cache, use_cache=True)
            nxt = o.logits[0, -1].argmax().view(1, 1)
    step(3); acc[:] = [0.0, 0]
    ts = []
    for _ in range(30):
        t = time.perf_counter(); step(1); ts.append(time.perf_counter() - t)
    ts.sort()
print(f"kvarn threads {kt}, torch {torch.get_num_threads()}: step median {ts[15]*1e3:.2f} ms min {ts[0]*1e3:.2f}; native attend per layer call {acc[0]/max(acc[1],1)*1e6:.1f} us over {acc[1]} calls")
