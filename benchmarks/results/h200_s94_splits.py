"""Fifty-fourth session, s94: attend's split choice for groups above 8 query heads per kv head. The kernels run
ceil(group / q_rows) programs per kv head and split (a group of 9-16 takes two 8-row programs, or four 4-row ones),
while PagedKVCache._choose_splits counted num_kv_heads programs per sequence whatever the group: at Hq 128 / Hk 8 and
32K x 1 it chose 16 splits for 128 programs, and the launch ran 256, two waves on 132 SMs. Here: the splits as
chosen (programs = Hk) against splits chosen for Hk x ceil(group / 8) programs, graph replays over L2-rotating
layers, kvarn attend with plans, D 128, k4v2_g128, bf16 q; both alternate, two rounds; outputs compared."""
import math
import os
import sys

import torch

import kvarn
import kvarn.cuda as kc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_cuda import L2_ROTATE_BYTES, graph_time  # noqa: E402

D = 128
R = kvarn.PRESETS["k4v2_g128"].record_bytes(D)
print(f"device: {torch.cuda.get_device_name(0)}")
POINTS = [(8, 128, ctx, b) for ctx, b in ((4096, 1), (8192, 1), (16384, 1), (32768, 1), (131072, 1), (8192, 2),
                                          (32768, 2), (8192, 4), (32768, 4), (32768, 8))]
POINTS += [(8, 96, 32768, 1), (8, 96, 8192, 2), (4, 64, 32768, 1), (4, 64, 131072, 1), (4, 64, 32768, 4)]
for hk, hq, ctx, batch in POINTS:
    tiles = max((ctx - 128) // 128, 1)
    n_layers = max(1, min(64, math.ceil(L2_ROTATE_BYTES / (batch * hk * (tiles * R + 128 * D * 4)))))
    cache = kc.PagedKVCache(hk, D, "k4v2_g128", num_layers=n_layers, max_seqs=batch, max_seq_len=ctx)
    ids = [cache.add_sequence() for _ in range(batch)]
    k = torch.randn(1, ctx, hk, D, device="cuda").to(torch.bfloat16)
    for layer in range(n_layers):
        for sid in ids:
            cache.append([sid], k, k, layer=layer, validate=False)
    chunks = -(-(hq // hk) // 8)
    old = [cache.plan(ids, layer=layer) for layer in range(n_layers)]
    real = cache._choose_splits
    cache._choose_splits = lambda tiles, pps: real(tiles, pps * chunks)
    new = [cache.plan(ids, layer=layer) for layer in range(n_layers)]
    cache._choose_splits = real
    q = torch.randn(batch, hq, D, device="cuda", dtype=torch.bfloat16)
    outs, times = {}, {"old": [], "new": []}
    for _ in range(2):
        for mode, plans in (("old", old), ("new", new)):
            out = torch.empty_like(q)
            ms, _ = graph_time(lambda i: cache.attend(q, plan=plans[i % n_layers], out=out, validate=False),
                               2 * n_layers)
            times[mode].append(ms * 1e3)
            outs[mode] = cache.attend(q, plan=plans[0]).float()
    diff = (outs["old"] - outs["new"]).abs().max().item() / outs["old"].abs().max().item()
    rows = [cache._choose_q_rows(hq, batch, p[0].splits, p[0].tiles_per_split) for p in (old, new)]
    print(f"Hk {hk} Hq {hq} ctx {ctx} B {batch}: old splits {old[0].splits} tps {old[0].tiles_per_split} rows {rows[0]} "
          f"{times['old'][0]:.1f}/{times['old'][1]:.1f} us; new splits {new[0].splits} tps {new[0].tiles_per_split} "
          f"rows {rows[1]} {times['new'][0]:.1f}/{times['new'][1]:.1f} us -> {min(times['old']) / min(times['new']):.2f}x"
          f" (outputs differ by {diff:.1e} of max)", flush=True)
    cache = old = new = None
    torch.cuda.empty_cache()
