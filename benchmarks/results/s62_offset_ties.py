"""Twenty-second session (from a report-only review of the quantiser, h38): keys with a large common offset,
1e4 + N(0, 1), stored as fp16 (step 8 at 1e4) in a KVCache with no sink, D 64, 133 tokens: the first 128 make a
tile, which some seeds' appends refuse as an fp16 overflow of the folded scale vectors (SPEC §3's identity and a
uniform rescaling of it tie exactly; kvarn's fp32 statistics may rank the identity lower, whose kz does not fit).
Run (kvarn installed): python benchmarks/results/s62_offset_ties.py > benchmarks/results/s62_offset_ties.log"""
import numpy as np
import kvarn

kvarn.set_num_threads(1)
for isa in kvarn.available_isas():
    kvarn.set_isa(isa)
    verdicts = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        k = (1e4 + rng.standard_normal((1, 133, 64))).astype(np.float16)
        v = rng.standard_normal((1, 133, 64)).astype(np.float16)
        cache = kvarn.KVCache(num_kv_heads=1, head_dim=64, sink_tokens=0)
        try:
            cache.append(k, v)
            verdicts.append("ok")
        except ValueError:
            verdicts.append("refused")
    print(f"{isa}: seeds 0-9 {verdicts}: {verdicts.count('refused')} of 10 refused")
