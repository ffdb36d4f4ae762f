# Per layer-step cost of the transformers integration (KVarNCache.update + kvarn attention, 30 layers, Hk 3 D 64,
# 1K tokens, 1 thread, no model): run once per build, alternating (ninth session: before / after the rollback and
# the per-forward length check). Its pieces are importable (the sixtieth session's emr2c_s100/layer_step_profile.py
# profiles the same loop); run as a script it does what it did then.
import time, torch
import kvarn
from kvarn.integrations.transformers import KVarNCache, kvarn_attention
from transformers import LlamaConfig

LAYERS, L, N = 30, 1000, 100  # layers; prompt tokens; steps per block


class M:
    sliding_window = None


def prefilled_cache(g):
    """A KVarNCache on a 30-layer SmolLM2-shaped config, each layer holding an L-token random prompt."""
    torch.set_num_threads(1); kvarn.set_num_threads(1)
    cfg = LlamaConfig(hidden_size=576, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=9,
                      num_key_value_heads=3, head_dim=64, vocab_size=100)
    cache = KVarNCache(cfg)
    for i in range(LAYERS):
        cache.update(torch.randn(1, 3, L, 64, generator=g), torch.randn(1, 3, L, 64, generator=g), i)
        cache.layers[i].store_prefill(None)
    return cache


def step_inputs(g):
    """N steps of (k, v, q) per layer."""
    return [[(torch.randn(1, 3, 1, 64, generator=g), torch.randn(1, 3, 1, 64, generator=g),
              torch.randn(1, 9, 1, 64, generator=g)) for _ in range(LAYERS)] for _ in range(N)]


def run_steps(cache, steps):
    for s in steps:
        for i, (k, v, q) in enumerate(s):
            kk, vv = cache.update(k, v, i)
            kvarn_attention(M, q, kk, vv, None, scaling=0.125)


if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    cache = prefilled_cache(g)
    best = float("inf")
    for block in range(3):  # the fastest of 3 blocks reported (the context grows 1000 -> 1300 tokens)
        steps = step_inputs(g)
        t = time.perf_counter()
        run_steps(cache, steps)
        best = min(best, (time.perf_counter() - t) / (N * LAYERS) * 1e6)
    print(f"per layer-step {best:.1f} us (min of 3 blocks of {N} steps x 30 layers)")
