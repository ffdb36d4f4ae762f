"""GPU regression sweep (H200) of shapes tests/test_cuda.py does not reach: GQA 5/7 (row-split, one
chunk of 5-7 heads), 9/12/17 (a second query chunk of 1/4/1 heads), custom sink_tokens 0 / 4 / 200
(tiles not aligned to G, no sink at all), single-token and boundary lengths, several sequences per
batch, all 5 presets x head_dim 64/128/256. Reference: the CPU kernels over the GPU's own records
(to_cpu + kvarn.attend). Expected (no defect): every line 'ok', worst relative error < 2e-4, no NaN."""
import itertools
import numpy as np
import torch
import kvarn
import kvarn.cuda as kc

rng = np.random.default_rng(1234)


def kv_like(shape):
    x = rng.standard_normal(shape)
    x[..., rng.choice(shape[-1], 4, replace=False)] *= 8.0
    return x.astype(np.float32)


worst = 0.0
fails = 0
for preset, D, sink in itertools.product(["k4v2_g128", "k4v4_g128", "k4v2_g64", "k4v4_g64", "k2v2_g128"],
                                         [64, 128, 256], [0, 4, 200]):
    G = kvarn.PRESETS[preset].group
    Hk = 2
    lengths = [1, 3, G - 1, G, G + 1, sink + G, sink + 2 * G + 5, sink + 7 * G + 3]
    cache = kc.PagedKVCache(Hk, D, preset, max_seqs=len(lengths), max_seq_len=max(lengths) + 4, sink_tokens=sink)
    ids = [cache.add_sequence() for _ in lengths]
    for sid, n in zip(ids, lengths):
        k, v = kv_like((1, n, Hk, D)), kv_like((1, n, Hk, D))
        cut = n // 3  # two appends: one may complete tiles across a partly filled tail
        for a, b in ((0, cut), (cut, n)):
            if b > a:
                cache.append([sid], torch.from_numpy(k[:, a:b]).cuda(), torch.from_numpy(v[:, a:b]).cuda())
    cpus = [cache.to_cpu(sid) for sid in ids]
    for gqa in (1, 5, 7, 9, 12, 17):
        q = kv_like((len(ids), Hk * gqa, D))
        out = cache.attend(torch.from_numpy(q).cuda(), ids).cpu().numpy()
        errs = []
        for b in range(len(ids)):
            ref = kvarn.attend(q[b], cpus[b], 1 / np.sqrt(D)).astype(np.float64)
            errs.append(np.linalg.norm(out[b] - ref) / np.linalg.norm(ref) if np.isfinite(out[b]).all() else np.inf)
        e = max(errs)
        worst = max(worst, e)
        ok = e < 2e-4
        fails += not ok
        print(f"{'ok ' if ok else 'BAD'} {preset} D{D} sink{sink} gqa{gqa}: max rel err {e:.2e}"
              + ("" if ok else f" (per sequence {np.array(errs)})"))
print(f"worst {worst:.2e}, {fails} failing cases")
