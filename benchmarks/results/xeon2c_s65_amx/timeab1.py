import numpy as np, kvarn, time, sys
from kvarn import _native
kvarn.set_num_threads(int(sys.argv[1]))
rng = np.random.default_rng(0)
Hk, D, Hq, n = 8, 128, 32, int(sys.argv[2])
c = kvarn.KVCache(Hk, D, preset="k4v2_g128")
for i in range(0, n, 4096):
    m = min(4096, n - i)
    c.append(rng.standard_normal((Hk, m, D)).astype(np.float32), rng.standard_normal((Hk, m, D)).astype(np.float32))
q = rng.standard_normal((Hq, D)).astype(np.float32)
def t(on, reps):
    _native.set_amx(on); best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter(); kvarn.attend(q, c); best = min(best, time.perf_counter() - t0)
    return best
res = {True: [], False: []}
for r in range(5):
    for on in (False, True): res[on].append(t(on, 20))
off, on = np.array(res[False]), np.array(res[True])
recs = Hk * (n // 128)
print(f"threads {sys.argv[1]} n {n}: per record vnni {np.median(off)/recs*1e9:.0f} ns, amx {np.median(on)/recs*1e9:.0f} ns, amx/vnni {np.median(on/off):.3f}")
