"""Fifty-third session, s93c: query rows per attend program, 8 (as before) against 4 (a group of 5-8 over two programs,
which at k4v2_g128 D 128 run the swapped-operand tiles, with warp pairs and push merge where they apply), for the
rule PagedKVCache._choose_q_rows should follow. Graph replays over L2-rotating layers (bench_cuda.graph_time), kvarn
attend with plans (the heuristic's splits), Hk 8, D 128, k4v2_g128, bf16 q; both row counts alternate, two rounds;
the two outputs compared (rtol = atol = 2e-2, bf16)."""
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
print(f"device: {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs")
bad = 0
for ctx, batch in ((4096, 1), (32768, 1), (131072, 1), (4096, 8), (32768, 8), (4096, 32), (32768, 32)):
    tiles = (ctx - 128) // 128
    n_layers = max(1, min(64, math.ceil(L2_ROTATE_BYTES / (batch * HK * (tiles * R + 128 * D * 4)))))
    cache = kc.PagedKVCache(HK, D, "k4v2_g128", num_layers=n_layers, max_seqs=batch, max_seq_len=ctx)
    ids = [cache.add_sequence() for _ in range(batch)]
    k = torch.randn(1, ctx, HK, D, device="cuda").to(torch.bfloat16)
    k[..., :4] *= 8
    v = torch.randn(1, ctx, HK, D, device="cuda", dtype=torch.bfloat16)
    for layer in range(n_layers):
        for sid in ids:
            cache.append([sid], k, v, layer=layer, validate=False)
    plans = [cache.plan(ids, layer=layer) for layer in range(n_layers)]
    for hq in (40, 48, 64, 128, 32):
        q = torch.randn(batch, hq, D, device="cuda", dtype=torch.bfloat16)
        times = {4: [], 8: []}
        outs = {}
        for _ in range(2):
            for rows in (8, 4):
                cache._choose_q_rows = lambda *args, rows=rows: rows  # (s93c ran it with three arguments)
                out = torch.empty_like(q)
                ms, _ = graph_time(lambda i: cache.attend(q, plan=plans[i % n_layers], out=out, validate=False),
                                   2 * n_layers)
                times[rows].append(ms * 1e3)
                outs[rows] = out.float()
        agree = torch.allclose(outs[4], outs[8], rtol=2e-2, atol=2e-2)
        bad += not agree
        t8, t4 = min(times[8]), min(times[4])
        print(f"ctx {ctx} B {batch} Hq {hq} splits {plans[0].splits}: 8 rows {times[8][0]:.1f}/{times[8][1]:.1f} us, "
              f"4 rows {times[4][0]:.1f}/{times[4][1]:.1f} us -> 8/4 {t8 / t4:.2f}x, agree {agree}", flush=True)
    cache = plans = None
    torch.cuda.empty_cache()
print("outputs disagree at", bad, "points")
