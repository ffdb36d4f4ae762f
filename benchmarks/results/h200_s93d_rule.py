"""Fifty-third session, s93d: PagedKVCache._choose_q_rows (4 query rows per program for short one-wave launches of
a k4v2_g128 D 128 group > 4, else 8) against always 8, at points s93c did not time. Graph replays over L2-rotating
layers, kvarn attend with plans (the heuristic's splits), Hk 8, D 128, bf16 q; both alternate, two rounds."""
import math
import os
import sys

import torch

import kvarn
import kvarn.cuda as kc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_cuda import L2_ROTATE_BYTES, graph_time  # noqa: E402

HK, D = 8, 128
R = kvarn.PRESETS["k4v2_g128"].record_bytes(D)
print(f"device: {torch.cuda.get_device_name(0)}")
for ctx, batch in ((1024, 1), (2048, 1), (4096, 1), (8192, 1), (16384, 1), (1024, 4), (1024, 8), (2048, 2),
                   (4096, 2), (4096, 4)):
    tiles = max((ctx - 128) // 128, 1)
    n_layers = max(1, min(64, math.ceil(L2_ROTATE_BYTES / (batch * HK * (tiles * R + 128 * D * 4)))))
    cache = kc.PagedKVCache(HK, D, "k4v2_g128", num_layers=n_layers, max_seqs=batch, max_seq_len=ctx)
    ids = [cache.add_sequence() for _ in range(batch)]
    k = torch.randn(1, ctx, HK, D, device="cuda").to(torch.bfloat16)
    for layer in range(n_layers):
        for sid in ids:
            cache.append([sid], k, k, layer=layer, validate=False)
    plans = [cache.plan(ids, layer=layer) for layer in range(n_layers)]
    rule = cache._choose_q_rows
    for hq in (40, 64, 128):
        q = torch.randn(batch, hq, D, device="cuda", dtype=torch.bfloat16)
        chosen = rule(hq, batch, plans[0].splits, plans[0].tiles_per_split)
        times = {"rule": [], "8": []}
        for _ in range(2):
            for mode in ("8", "rule"):
                cache._choose_q_rows = rule if mode == "rule" else (lambda *args: 8)
                out = torch.empty_like(q)
                ms, _ = graph_time(lambda i: cache.attend(q, plan=plans[i % n_layers], out=out, validate=False),
                                   2 * n_layers)
                times[mode].append(ms * 1e3)
        print(f"ctx {ctx} B {batch} Hq {hq} splits {plans[0].splits} tps {plans[0].tiles_per_split}: rule -> {chosen} rows "
              f"{times['rule'][0]:.1f}/{times['rule'][1]:.1f} us, always 8 {times['8'][0]:.1f}/{times['8'][1]:.1f} us "
              f"-> {min(times['8']) / min(times['rule']):.2f}x", flush=True)
    cache = plans = None
    torch.cuda.empty_cache()
