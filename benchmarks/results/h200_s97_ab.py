"""Fifty-seventh session, device call s97b: the one-token decode path (e5be537) against the general path in ONE
process: KVarNCache's per-layer step (checkpoint + append_attend(validate=False, flags=)) at Hq 32 / Hk 8 / D 128,
bf16, 16K tokens, batch 1 and 8, in alternating blocks of 200 steps with kvarn.cuda._DECODE_ROWS at 32 (decode
path) and 0 (general path); per block the median us per step, then the ratio of the medians of the blocks."""
import statistics
import time

import torch

import kvarn.cuda as kc

HQ, HK, D, N = 32, 8, 128, 16384
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, device=dev, generator=g, dtype=torch.bfloat16)


for B in (1, 8):
    paged = kc.PagedKVCache(HK, D, num_layers=1, max_seqs=B, max_seq_len=N + 4096)
    seqs = [paged.add_sequence() for _ in range(B)]
    for s in seqs:
        paged.append([s], rnd(1, N, HK, D), rnd(1, N, HK, D))
    q, k, v = rnd(B, HQ, 1, D), rnd(B, HK, 1, D), rnd(B, HK, 1, D)  # transformers' layouts
    flags = torch.zeros(1, dtype=torch.int32, device=dev)
    blocks = {32: [], 0: []}
    for rnd_i in range(8):
        for rows in (32, 0) if rnd_i % 2 == 0 else (0, 32):
            kc._DECODE_ROWS = rows
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                paged.checkpoint(seqs, 1)
                paged.append_attend(q.transpose(1, 2), seqs, k.transpose(1, 2), v.transpose(1, 2), validate=False,
                                    flags=flags)
                times.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            blocks[rows].append(1e6 * statistics.median(times))
    new, old = statistics.median(blocks[32]), statistics.median(blocks[0])
    print(f"batch {B}: decode path {' '.join(f'{x:.1f}' for x in blocks[32])} us")
    print(f"batch {B}: general path {' '.join(f'{x:.1f}' for x in blocks[0])} us")
    print(f"batch {B}: median of blocks {new:.1f} / {old:.1f} us = {new / old:.3f}")
