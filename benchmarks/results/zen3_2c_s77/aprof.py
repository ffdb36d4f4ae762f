import numpy as np, sys, time, os

import kvarn
if os.environ.get("VNNI") == "0":
    import kvarn._native
    kvarn._native.set_vnni(False)  # the vpmaddwd / vpmaddubsw forms, as on a CPU without AVX-VNNI
rng = np.random.default_rng(0)
hk, hq, D = [int(x) for x in os.environ.get("SHAPE", "3,9,64").split(",")]
n = int(os.environ.get("CTX", 32768)); th = int(os.environ.get("TH", 1)); N = int(os.environ.get("N", 300))
c = kvarn.KVCache(hk, D)
k = rng.standard_normal((hk, n, D)).astype(np.float32); k[..., :4] *= 8
c.append(k, rng.standard_normal((hk, n, D)).astype(np.float32))
q = rng.standard_normal((hq, D)).astype(np.float32)
for _ in range(5): kvarn.attend(q, c, num_threads=th)
best = 1e9
t = time.perf_counter()
for _ in range(N):
    a = time.perf_counter(); kvarn.attend(q, c, num_threads=th); best = min(best, time.perf_counter() - a)
dt = (time.perf_counter() - t) / N
print(f"{kvarn.active_isa()} {kvarn.score_mode()} {hk},{hq},{D} threads {th}: mean {dt*1e3:.3f} best {best*1e3:.3f} ms/call, {best*1e6/(n//128*hk):.3f} us per record")
