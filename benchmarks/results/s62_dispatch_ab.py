# Twenty-second session: one core's time per k4v2 record (Hq 32, Hk 8, D 128, 32K tokens) for two builds, in
# alternating rounds (a subprocess per build and round, min of 10 calls): the head-count dispatch before the
# with_head_count clean-up (cede6df) and after it. Usage: s62_dispatch_ab.py SITE_BEFORE SITE_AFTER [rounds]
import os, subprocess, sys

MEASURE = r"""
import time, numpy as np, kvarn
from kvarn import _native
rng = np.random.default_rng(0)
c = kvarn.KVCache(8, 128)
c.append(rng.standard_normal((8, 32768, 128)).astype(np.float32), rng.standard_normal((8, 32768, 128)).astype(np.float32))
q = rng.standard_normal((32, 128)).astype(np.float32)
rec = c.num_tiles * 8
out = []
for isa in [i for i in kvarn.available_isas() if i != "scalar"]:
    kvarn.set_isa(isa)
    for mode in ("int16", "int8", "float"):
        _native.set_score_mode(mode)
        if _native.score_mode() != mode:
            continue
        ts = []
        for _ in range(10):
            t = time.perf_counter(); kvarn.attend(q, c, num_threads=1); ts.append(time.perf_counter() - t)
        out.append(f"{isa}-{mode}={min(ts) / rec * 1e6:.3f}")
print(" ".join(out))
"""
before, after = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
results = {"before": [], "after": []}
for r in range(rounds):
    for name, site in ((("before", before), ("after", after)) if r % 2 == 0 else (("after", after), ("before", before))):
        env = dict(os.environ, PYTHONPATH=site)
        line = subprocess.run([sys.executable, "-c", MEASURE], env=env, capture_output=True, text=True, check=True).stdout
        results[name].append(dict(kv.split("=") for kv in line.split()))
        print(f"round {r} {name:6s} {line.strip()}", flush=True)
print("medians (us per record), after / before:")
for key in results["after"][0]:
    b = sorted(float(x[key]) for x in results["before"])[rounds // 2]
    a = sorted(float(x[key]) for x in results["after"])[rounds // 2]
    print(f"  {key:14s} before {b:.3f}  after {a:.3f}  ratio {a / b:.3f}")
