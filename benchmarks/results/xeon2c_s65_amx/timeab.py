import numpy as np, kvarn, time, sys
from kvarn import _native
rng = np.random.default_rng(0)
Hk, D, Hq, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else "int16"
c = kvarn.KVCache(Hk, D, preset="k4v2_g128")
for i in range(0, n, 4096):
    m = min(4096, n - i)
    c.append(rng.standard_normal((Hk, m, D)).astype(np.float32), rng.standard_normal((Hk, m, D)).astype(np.float32))
q = rng.standard_normal((Hq, D)).astype(np.float32)
_native.set_score_mode(mode)
def t(on, reps):
    _native.set_amx(on)
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter(); kvarn.attend(q, c); best = min(best, time.perf_counter() - t0)
    return best
res = {True: [], False: []}
for r in range(6):
    for on in (False, True):
        res[on].append(t(on, 30))
off, on = np.array(res[False]), np.array(res[True])
print(f"Hk{Hk} D{D} Hq{Hq} n{n} {mode} threads {kvarn.get_num_threads()}: vnni {np.median(off)*1e3:.3f} ms, amx {np.median(on)*1e3:.3f} ms, per-round amx/vnni median {np.median(on/off):.3f} [{(on/off).min():.3f}, {(on/off).max():.3f}]")
