"""h48: avx2 int8 vs avx2 int16 attend time, same process, alternating rounds.
PYTHONPATH=<site> python ab.py <label>: per shape, threads and VNNI on/off, 6 rounds; each round times both modes
(order alternating), min of 20 calls each; prints the per-round int8/int16 ratios and their median."""
import sys
import time

import numpy as np

import kvarn
from kvarn import _native

label = sys.argv[1] if len(sys.argv) > 1 else "?"
ROUNDS, CALLS = 6, 20
rng = np.random.default_rng(1)
kvarn.set_isa("avx2")
print(f"[{label}] kvarn from {kvarn.__file__}")
for Hq, Hk, D in [(32, 8, 128), (9, 3, 64)]:
    n = 32768
    c = kvarn.KVCache(Hk, D, preset="k4v2_g128")
    x = rng.standard_normal((Hk, n, D))
    x[..., :4] *= 8
    c.append(x.astype(np.float32), rng.standard_normal((Hk, n, D)).astype(np.float32))
    q = rng.standard_normal((Hq, D)).astype(np.float32)
    for threads in (1, 2):
        for vnni in (True, False):
            _native.set_vnni(vnni)
            ratios, best = [], {"int8": np.inf, "int16": np.inf}
            for r in range(ROUNDS):
                t = {}
                for mode in (("int8", "int16") if r % 2 == 0 else ("int16", "int8")):
                    _native.set_score_mode(mode)
                    assert _native.score_mode() == mode
                    kvarn.attend(q, c, num_threads=threads)  # warm
                    ts = []
                    for _ in range(CALLS):
                        t0 = time.perf_counter()
                        kvarn.attend(q, c, num_threads=threads)
                        ts.append(time.perf_counter() - t0)
                    t[mode] = min(ts)
                    best[mode] = min(best[mode], t[mode])
                ratios.append(t["int8"] / t["int16"])
            _native.set_vnni(True)
            print(f"[{label}] Hq {Hq:2d} Hk {Hk} D {D:3d} n {n} threads {threads} vnni {'on ' if vnni else 'off'}: "
                  f"int8/int16 median {np.median(ratios):.3f} rounds [{' '.join(f'{x:.3f}' for x in ratios)}]  "
                  f"best int8 {best['int8'] * 1e3:.2f} ms int16 {best['int16'] * 1e3:.2f} ms", flush=True)
