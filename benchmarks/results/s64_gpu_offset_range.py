"""Twenty-fourth session: does the k4v2 kernels' 128K drift (s63: relative error up to 7.1e-4 where the output cancels)
come from the offset codes' accumulators leaving fp32's exact range? In P.V every product p' va has one sign and under a
flat softmax every p' sits near its maximum, so -1024 * sum(hi) reaches ~2^32 at the old 2^15 product scale, past the
2^30 up to which multiples of 2^6 (the hi grid) are exact. s64b tested that hypothesis by scaling the products below
2^12 (h200_s64b/pv_scale_2e12.patch): 7x worse, refuted; s64c / s64d ran it on the per-tile scale that landed.
Cases, float64 oracle over the same records (as s63_gpu_long_accuracy.py): "rand" (the bench's data: random q, random
V), "voff" (V + 3: the output does not cancel), "qpos" (queries whose Hadamard-rotated form is positive, so q * ka has
one sign in the QK product too: the same question for the scores). Columns: relative error ||x - f64|| / ||f64|| of
the GPU and of the CPU float path; "wtd" = ||GPU - f64|| / sqrt(sum p ||v||^2), the error against the values summed.
Run on the device: python3 benchmarks/results/s64_gpu_offset_range.py"""
import math

import numpy as np
import torch

import kvarn
import kvarn.cuda as kc
from kvarn import _native

HQ, HK, D = 32, 8, 128
print("kvarn from", kvarn.__file__, flush=True)


def oracle(q, K, V):
    g = HQ // HK
    s = np.einsum("hgd,htd->hgt", q.reshape(HK, g, D), K) / math.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("hgt,htd->hgd", p, V).reshape(HQ, D)
    return out, float(np.sqrt(np.einsum("hgt,ht->", p, (V ** 2).sum(-1))))


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


print("case  ctx    batch | GPU rel   CPU float rel | GPU wtd  | |out|/rms(v)")
for case, points in (("rand", [(32768, 32), (131072, 1), (131072, 8), (131072, 32)]),
                     ("voff", [(131072, 32)]), ("qpos", [(32768, 8), (131072, 32)])):
    for ctx, batch in points:
        torch.manual_seed(0)
        cache = kc.PagedKVCache(HK, D, "k4v2_g128", num_layers=1, max_seqs=batch, max_seq_len=ctx)
        ids = [cache.add_sequence() for _ in range(batch)]
        k = torch.randn(1, ctx, HK, D, device="cuda").to(torch.bfloat16)
        v = (torch.randn(1, ctx, HK, D, device="cuda") + (3.0 if case == "voff" else 0.0)).to(torch.bfloat16)
        k[..., :4] *= 8  # as bench_cuda.fill_cache
        for sid in ids:
            cache.append([sid], k, v, validate=False)
        cpu = cache.to_cpu(ids[0], 0)
        K, V = (x.astype(np.float64) for x in cpu.dequantize())
        q = torch.randn(batch, HQ, D, device="cuda")
        if case == "qpos":  # rotated query |z|: the kernels' q * ka (rotated frame, ka > 0) has one sign
            q = torch.from_numpy(kvarn.hadamard(np.abs(q.cpu().numpy()).reshape(-1, D)).reshape(batch, HQ, D)).cuda()
        q0 = q[0].cpu().numpy()
        gpu = cache.attend(q, ids)[0].cpu().numpy()
        want, vn = oracle(q0.astype(np.float64), K, V)
        mode = _native.score_mode()
        _native.set_score_mode("float")
        cpu_out = kvarn.attend(q0, cpu)
        _native.set_score_mode(mode)
        print(f"{case}  {ctx:6d} {batch:3d}   | {rel(gpu, want):.2e}  {rel(cpu_out, want):.2e}      | "
              f"{np.linalg.norm(gpu - want) / vn:.2e} | {np.linalg.norm(want) / np.sqrt((V ** 2).mean() * want.size):.4f}",
              flush=True)
        del cache
        torch.cuda.empty_cache()
