# TurboQuant-style rows of `kvarn eval` at the default window (SmolLM2, 2048 tokens, from position 256):
# the codebook before 3feade0 (Lloyd iterations over grid-point sums, stopped once no grid point changed
# cell) against the committed one (continuous iterations run to convergence), same model forwards.
# Run from the repository root with the package importable and `git show 04c68c9:src/kvarn/eval_quantizers.py
# > lm_old.py` beside this script.
import os, sys, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvarn import eval as ev, eval_quantizers as eq
from kvarn.integrations import assets
from lm_old import lloyd_max_codebook as old_codebook
torch.set_num_threads(2)
model, tok = assets.load_model("smollm2-135m")
text_ids, _ = ev.story_ids(tok, assets.verne_text(), 2048, 0, 0, 384, 48)
sl = slice(256, 2047)
targets = torch.tensor(text_ids[257:])
ref = ev.forward_logits(model, text_ids, ev.PseudoDecode(None, 128, 128))
ref_logp = torch.log_softmax(ref[sl].double(), -1).float()
print("fp32", ev.compare_logits(ref_logp, ref[sl], targets), flush=True)
new_codebook = eq.lloyd_max_codebook
for label, cb in (("old", old_codebook), ("new", new_codebook)):
    eq.lloyd_max_codebook = cb
    for m in ev.build_methods(64, [], baselines=True):
        if m.family == "turboquant":
            att = ev.PseudoDecode(m, 128, m.group, own_tile_exact=True)
            print(label, m.name, ev.compare_logits(ref_logp, ev.forward_logits(model, text_ids, att)[sl], targets),
                  flush=True)
