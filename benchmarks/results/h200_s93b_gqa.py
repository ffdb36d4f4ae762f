"""Fifty-third session, s93b: how a program's query-row count prices one-token decode on the GPU -- the question
behind joining a step's token rows inside a program (docs/cuda.md: today a step's launch gives each (sequence,
token) its own programs). Graph replays over L2-rotating layers (bench_cuda.graph_time), kvarn attend with plans,
Hk 8, D 128, k4v2_g128, bf16 q; Hq 16 / 32 / 64 / 128 = 2 / 4 / 8 / 16 query rows per kv head (a program takes <= 8
rows: 16 rows are two programs). A step of n tokens at GQA 4 with rows joined would price like GQA 4n."""
import math
import os
import sys

import torch

import kvarn.cuda as kc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_cuda import L2_ROTATE_BYTES, graph_time  # noqa: E402
import kvarn  # noqa: E402

HK, D = 8, 128
R = kvarn.PRESETS["k4v2_g128"].record_bytes(D)
print(f"device: {torch.cuda.get_device_name(0)}")
for ctx, batch in ((4096, 1), (32768, 1), (4096, 8), (32768, 8), (32768, 32)):
    tiles = (ctx - 128) // 128
    n_layers = max(1, min(64, math.ceil(L2_ROTATE_BYTES / (batch * HK * (tiles * R + 128 * D * 4)))))
    cache = kc.PagedKVCache(HK, D, "k4v2_g128", num_layers=n_layers, max_seqs=batch, max_seq_len=ctx)
    ids = [cache.add_sequence() for _ in range(batch)]
    k = torch.randn(1, ctx, HK, D, device="cuda").to(torch.bfloat16)
    for layer in range(n_layers):
        for sid in ids:
            cache.append([sid], k, k, layer=layer, validate=False)
    plans = [cache.plan(ids, layer=layer) for layer in range(n_layers)]
    line = []
    for round_ in range(2):
        for hq in (16, 32, 64, 128):
            q = torch.randn(batch, hq, D, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(q)
            ms, _ = graph_time(lambda i: cache.attend(q, plan=plans[i % n_layers], out=out, validate=False), 2 * n_layers)
            line.append(f"Hq {hq} {ms * 1e3:.1f}")
    print(f"ctx {ctx} B {batch} (us, two rounds): " + ", ".join(line), flush=True)
    del cache, plans
    torch.cuda.empty_cache()
