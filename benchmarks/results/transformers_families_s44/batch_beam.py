"""Left-padded batch generation (mask with leading zeros) and num_beams=2: KVarNCache(k8v8) vs DynamicCache."""
import sys, torch, warnings, traceback
sys.argv.append("-q")
warnings.filterwarnings("ignore")
from harness import build, greedy, KVarNCache, restore_attention

def cmp(name, P, pads, **gk):
    m = build(name)
    B = len(pads)
    ids = torch.randint(3, 200, (B, P), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    for b, p in enumerate(pads):
        mask[b, :p] = 0; ids[b, :p] = 0
    ref = greedy(m, ids, n=30, mask=mask, **gk)
    try:
        out = greedy(m, ids, cache=KVarNCache(m.config, preset="k8v8_g128"), n=30, mask=mask, **gk)
    except Exception as e:
        restore_attention(m.config)
        return print(f"{name} P={P} pads={pads} {gk}: {type(e).__name__}: {str(e)[:200]}")
    restore_attention(m.config)
    eq = (ref.sequences[:, P:] == out.sequences[:, P:]).float().mean(1).tolist()
    # first-step logits diff (teacher-forcing not needed: step 1 logits follow identical prefixes when step 0 agrees)
    d = [(a - b).abs().amax(-1) for a, b in zip(ref.logits[:2], out.logits[:2])]
    # per-row single (unpadded) reference for the padded row to check padding is really excluded
    solo = greedy(m, ids[-1:, pads[-1]:], n=30, **gk) if not gk else None
    solo_eq = (solo.sequences[0, P - pads[-1]:] == ref.sequences[-1, P:]).float().mean().item() if solo is not None else None
    print(f"{name} P={P} pads={pads} {gk}: token agreement per row {[round(x, 2) for x in eq]}; "
          f"logit diff step0 {[f'{x:.1e}' for x in d[0].tolist()]} step1 {[f'{x:.1e}' for x in d[1].tolist()]}"
          + (f"; dyn padded row vs unpadded solo agreement {solo_eq:.2f}" if solo_eq is not None else ""))

for name in ("llama", "qwen3", "gemma3", "gpt2"):
    for P in (40, 300):
        cmp(name, P, [0, 7, 3])
cmp("llama", 40, [0, 0], num_beams=2)
cmp("llama", 300, [0, 0], num_beams=2)
cmp("qwen3", 300, [0, 5], num_beams=2)
cmp("gemma3", 300, [0, 5], num_beams=2, num_return_sequences=2)
