"""Twenty-second session: how far apart kvarn's computed imbalances of exactly tying SPEC §3 candidates lie (the
identity and candidate 1, a uniform rescaling of it where every std clamps alike), per construction and head_dim.
Needs a scalar build with s62_tie_gaps.patch applied (it prints each candidate's imbalance relative to the lowest
so far when KVDBG is set): KVDBG=1 python benchmarks/results/s62_tie_gaps.py 2>&1 | python ... (below, in-process)."""
import os, re, subprocess, sys
import numpy as np

if os.environ.get("KVDBG_CHILD"):
    import kvarn
    kvarn.set_isa("scalar")
    for name, make in (("fp16 offset 1e4", lambda r, D: (1e4 + r.standard_normal((128, D))).astype(np.float16)),
                       ("fp32 offset 1e4", lambda r, D: 1e4 + r.standard_normal((128, D))),
                       ("fp32 tiny 1e-6", lambda r, D: 1e-6 * r.standard_normal((128, D)))):
        for D in (64, 128, 256, 1024):
            for seed in range(10):
                x = make(np.random.default_rng(seed), D).astype(np.float32)
                print(f"CASE {name} D{D}", file=sys.stderr, flush=True)
                kvarn._ops.balance_scales(np.ascontiguousarray(kvarn.hadamard(x).T))  # K layout: rows = channels
    sys.exit(0)
run = subprocess.run([sys.executable, __file__], env=dict(os.environ, KVDBG="1", KVDBG_CHILD="1"),
                     capture_output=True, text=True, check=True)
gaps, case = {}, None
for line in run.stderr.splitlines():
    if line.startswith("CASE "):
        case = line[5:]
    elif (m := re.match(r"it 0 rel (\S+)", line)):  # candidate 1 against the identity
        gaps.setdefault(case, []).append(abs(float(m.group(1))))
for case, g in gaps.items():
    print(f"{case:24s} |imbalance(candidate 1) / imbalance(identity) - 1| over 10 seeds: {min(g):.1e} .. {max(g):.1e}")
