"""Nineteenth session: do the published normalisation-only tiles move with the SPEC §3 imbalance fix (e0aa744)?
Before running: git show e0aa744^:src/kvarn/eval_quantizers.py > /tmp/eq_old.py
Output (2026-12-01, Zen 3): "layers 30 differing 0 of 90"."""
import numpy as np, importlib.util, torch, time
from kvarn import eval_quantizers as new
from kvarn.integrations import assets
spec=importlib.util.spec_from_file_location("kvarn.eq_old", "/tmp/eq_old.py"); old=importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
model, tok = assets.load_model("smollm2-135m")
ids = assets.verne_token_ids(tok, 2048)
with torch.no_grad():
    out = model(torch.tensor([ids]), use_cache=True)
pkv = out.past_key_values
diff=tot=0; G=128
for l, layer in enumerate(pkv.layers):
    k = layer.keys[0].double().numpy(); v = layer.values[0].double().numpy()  # [H, n, D]
    H, n, D = k.shape; nt = (n - 128) // G
    kt = k[:, 128:128+nt*G].reshape(H*nt, G, D); vt = v[:, 128:128+nt*G].reshape(H*nt, G, D)
    for kb, vb in ((4,2),(2,2),(4,4)):
        a = new.normalisation_only(kt, vt, kb, vb); b = old.normalisation_only(kt, vt, kb, vb)
        tot += 1; diff += not (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))
print("layers", len(pkv.layers), "differing", diff, "of", tot)
