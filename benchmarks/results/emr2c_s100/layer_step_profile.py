"""cProfile of layer_step_ab_s26.py's loop (KVarNCache.update + kvarn attention, 30 layers, Hk 3 / D 64, 1K tokens, 1 thread,
100 steps): self time per function, the 30 largest."""
import cProfile, pstats, sys, time, torch, numpy as np
import kvarn
from kvarn.integrations.transformers import KVarNCache, kvarn_attention
from transformers import LlamaConfig
torch.set_num_threads(1); kvarn.set_num_threads(1)
cfg = LlamaConfig(hidden_size=576, intermediate_size=128, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3, head_dim=64, vocab_size=100)
cache = KVarNCache(cfg)
L = 1000
class M: sliding_window = None
g = torch.Generator().manual_seed(0)
for i in range(30):
    k, v = cache.update(torch.randn(1, 3, L, 64, generator=g), torch.randn(1, 3, L, 64, generator=g), i)
    cache.layers[i].store_prefill(None)
N = 100
steps = [[(torch.randn(1, 3, 1, 64, generator=g), torch.randn(1, 3, 1, 64, generator=g),
           torch.randn(1, 9, 1, 64, generator=g)) for _ in range(30)] for _ in range(N)]
def run():
    for s in steps:
        for i, (k, v, q) in enumerate(s):
            kk, vv = cache.update(k, v, i)
            kvarn_attention(M, q, kk, vv, None, scaling=0.125)
pr = cProfile.Profile(); pr.enable(); run(); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
