"""Fifty-fifth session, device call s95c: host time per layer of a one-token decode step, the GPU transformers cache's
work against StaticCache's, at the llama8b shape of bench_generate_cuda.py (Hq 32, Hk 8, head_dim 128, bf16, 16K
tokens, batch 1): median microseconds a call keeps the host busy (no synchronisation inside the timed calls; the
GPU runs behind). kvarn: PagedKVCache.checkpoint + append_attend (validate=False with flags, as KVarNCache's layers
call it; and validate=True, which waits); the whole KVarNCudaLayer.update + attend_pending; static: StaticCache's
layer update (index_copy_ into preallocated K/V) + transformers' sdpa_attention_forward."""
import statistics
import time

import torch

import kvarn.cuda as kc
from kvarn.integrations.transformers import KVarNCudaLayer

B, HQ, HK, D, N, REPS = 1, 32, 8, 128, 16384, 300
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, device=dev, generator=g, dtype=torch.bfloat16)


def host_us(fn, reps=REPS):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()  # outside the timed call: each call starts with the GPU idle
    return 1e6 * statistics.median(times)


paged = kc.PagedKVCache(HK, D, num_layers=1, max_seqs=B, max_seq_len=N + 8 * REPS)
s = paged.add_sequence()
paged.append([s], rnd(B, N, HK, D), rnd(B, N, HK, D))
q, k, v = rnd(B, HQ, 1, D), rnd(B, HK, 1, D), rnd(B, HK, 1, D)  # transformers' layouts
flags = torch.zeros(1, dtype=torch.int32, device=dev)


def kvarn_deferred():
    paged.checkpoint([s], 1)
    paged.append_attend(q.transpose(1, 2), [s], k.transpose(1, 2), v.transpose(1, 2), validate=False, flags=flags)


def kvarn_validated():
    paged.checkpoint([s], 1)
    paged.append_attend(q.transpose(1, 2), [s], k.transpose(1, 2), v.transpose(1, 2))


layer = KVarNCudaLayer(device=0, max_cache_len=N + 8 * REPS)
layer.update(rnd(B, HK, N, D), rnd(B, HK, N, D))
layer.store_prefill(None)


def kvarn_layer():
    layer.update(k, v)
    layer.attend_pending(q, None, D ** -0.5)


from transformers import LlamaConfig, StaticCache  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

cfg = LlamaConfig(num_hidden_layers=1, num_attention_heads=HQ, num_key_value_heads=HK, head_dim=D, hidden_size=4096)
static = StaticCache(config=cfg, max_cache_len=N + 8 * REPS)
static.update(rnd(B, HK, N, D), rnd(B, HK, N, D), 0, {"cache_position": torch.arange(N, device=dev)})
module = torch.nn.Module()
module.num_key_value_groups, module.is_causal, module.training = HQ // HK, True, False
pos = torch.tensor([N], device=dev)
mask = torch.ones(B, 1, 1, N + 8 * REPS, dtype=torch.bool, device=dev)


def static_step():
    kk, vv = static.update(k, v, 0, {"cache_position": pos})
    sdpa_attention_forward(module, q, kk, vv, mask, scaling=D ** -0.5)


print(torch.cuda.get_device_name(), f"B {B}, Hq {HQ}, Hk {HK}, D {D}, {N} tokens, bf16; median host us per call")
for name, fn in (("kvarn: checkpoint + append_attend(flags)", kvarn_deferred),
                 ("kvarn: checkpoint + append_attend(validate)", kvarn_validated),
                 ("kvarn: KVarNCudaLayer update + attend_pending", kvarn_layer),
                 ("static: StaticCache update + sdpa", static_step)):
    host_us(fn, 20)  # warm up
    print(f"{name:48s} {host_us(fn):8.1f}")
