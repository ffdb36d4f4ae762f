"""Fifty-fifth session: how far a quantised cache moves a random-weight model's logits, on the host path (Zen 4, CPU,
fp32): a Llama of hidden 1024, Hq 32 / Hk 8, head_dim 128 with L layers and a P-token random prompt, 12 steps
teacher-forced with DynamicCache's greedy tokens; relative L2 of the logits against DynamicCache's, median over steps.
    PYTHONPATH=<site> python random_model_logits.py L [P]      (log: random_model_logits.log)"""
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM, DynamicCache
from kvarn.integrations.transformers import KVarNCache, cache_kwargs, restore_attention
L = int(sys.argv[1]) if len(sys.argv) > 1 else 8
cfg = LlamaConfig(hidden_size=1024, intermediate_size=2048, num_hidden_layers=L, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=8192)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
model.config._attn_implementation = "sdpa"
P = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
prompt = torch.randint(10, 32000, (1, P), generator=torch.Generator().manual_seed(1))
def run(cache, fed=None, steps=12):
    out = model(prompt, **cache_kwargs(model, cache), logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True) if fed is None else fed[0]
    toks, logs = [], []
    for i in range(steps):
        toks.append(nxt)
        out = model(nxt, **cache_kwargs(model, cache), logits_to_keep=1)
        logs.append(out.logits[:, -1].float())
        nxt = out.logits[:, -1].argmax(-1, keepdim=True) if fed is None else (fed[i + 1] if i + 1 < steps else None)
    return toks, torch.stack(logs)
with torch.inference_mode():
    fed, ref = run(DynamicCache(config=model.config))
    for name, mk in (("dynamic again", lambda: DynamicCache(config=model.config)),
                     ("kvarn host k4v2", lambda: KVarNCache(model.config)),
                     ("kvarn host k4v4", lambda: KVarNCache(model.config, preset="k4v4_g128"))):
        restore_attention(model)
        _, lg = run(mk(), fed)
        err = ((lg - ref).norm(dim=-1) / ref.norm(dim=-1)).flatten()
        print(f"L={L} {name:16s} logits rel L2 median {float(err.median()):.3e}  argmax agree {float((lg.argmax(-1)==ref.argmax(-1)).float().mean()):.2f}", flush=True)
