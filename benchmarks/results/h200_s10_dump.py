"""s10: attention outputs over every kernel path the attend.cuh refactor touched (cluster_merge,
push_merge, both prologues' sink/tail loaders and online-softmax steps), saved to an .npz so that two
builds can be compared bit for bit (h200_s10_run1.sh). Run once per KVARN_ATTEND_VARIANT (read once
per process).
    python3 benchmarks/results/h200_s10_dump.py OUT.npz [--full]
--full: every preset x head_dim 64/128/256 x GQA 1/4/8; else k4v2_g128 D 128 at GQA 1/2/4 (the
swapped-operand variants). Each case: sequences of 1, G + 1, 3 G + 5, 9 G + 7 and 20 G + 3 tokens
(sink only, sink + tail, tiles; D 256 shorter), attended with the heuristic's splits and forced 1, 2, 3,
5 and 9 splits (9: the merge kernel), fp32 out, and once in bf16."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import kvarn  # noqa: E402
import test_cuda as t  # noqa: E402


def main(path, full):
    cases = ([(p, D, g) for p in t.PRESETS for D in (64, 128, 256) for g in (1, 4, 8)] if full
             else [("k4v2_g128", 128, g) for g in (1, 2, 4)])
    res = {}
    for preset, D, gqa in cases:
        G = kvarn.PRESETS[preset].group
        lengths = [1, G + 1, 3 * G + 5, 9 * G + 7, 20 * G + 3] if D != 256 else [1, G + 1, 3 * G + 5, 9 * G + 7]
        rng = np.random.default_rng(t._seed("s10", preset, D, gqa))
        cache, ids = t.build(preset, D, 2, lengths, rng)
        q = t.kv_like(rng, (len(ids), 2 * gqa, D))
        key = f"{preset}_d{D}_g{gqa}"
        res[f"{key}_heur"] = cache.attend(t.dev(q), ids).cpu().numpy()
        for splits in (1, 2, 3, 5, 9):
            t.force_splits(cache, splits)
            res[f"{key}_s{splits}"] = cache.attend(t.dev(q), ids).cpu().numpy()
        res[f"{key}_s9_bf16"] = cache.attend(t.dev(q, torch.bfloat16), ids).float().cpu().numpy()
    np.savez(path, **res)
    print(f"dumped {len(res)} outputs ({len(cases)} cases) to {path}")


if __name__ == "__main__":
    main(sys.argv[1], "--full" in sys.argv)
