"""Fifty-fourth session, s94b: what PagedKVCache.fork costs, against the way a sequence was copied before it
(to_cpu + load_cpu per layer, through the host). Hk 8, D 128, k4v2_g128, 32 layers (Llama-3-8B's shape), one
sequence of ctx tokens forked; wall time of the call (it waits for its copies), min of 5 (the copy: of 2); the pages the fork takes
(none: shared) against the copy's."""
import time

import torch

import kvarn.cuda as kc

HK, D, L = 8, 128, 32
print(f"device: {torch.cuda.get_device_name(0)}")
for ctx in (1000, 4096, 32768):
    cache = kc.PagedKVCache(HK, D, "k4v2_g128", num_layers=L, max_seqs=3, max_seq_len=ctx)
    a = cache.add_sequence()
    k = torch.randn(1, ctx, HK, D, device="cuda").to(torch.bfloat16)
    for layer in range(L):
        cache.append([a], k, k, layer=layer, validate=False)
    torch.cuda.synchronize()
    fork_s, copy_s = [], []
    for rep in range(5):
        free = cache.free_pages
        t0 = time.perf_counter()
        b = cache.fork(a)
        fork_s.append(time.perf_counter() - t0)
        fork_pages = free - cache.free_pages
        cache.free(b)
        if rep >= 2:
            continue
        t0 = time.perf_counter()
        c = cache.add_sequence()
        for layer in range(L):
            cache.load_cpu(c, cache.to_cpu(a, layer), layer=layer)
        torch.cuda.synchronize()
        copy_s.append(time.perf_counter() - t0)
        copy_pages = free - cache.free_pages
        cache.free(c)
    print(f"ctx {ctx}: fork {min(fork_s) * 1e3:.2f} ms ({fork_pages} pages taken); to_cpu + load_cpu per layer "
          f"{min(copy_s) * 1e3:.1f} ms ({copy_pages} pages) -> {min(copy_s) / min(fork_s):.0f}x", flush=True)
    cache = None
    torch.cuda.empty_cache()
