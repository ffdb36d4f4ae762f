import sys, time, numpy as np, kvarn
hq, hk, d, n = 32, 8, 128, 32768
rng = np.random.default_rng(0)
k = rng.standard_normal((hk, n, d), dtype=np.float32); v = rng.standard_normal((hk, n, d), dtype=np.float32)
c = kvarn.KVCache(hk, d)
for s in range(0, n, 4096): c.append(k[:, s:s+4096], v[:, s:s+4096])
q = rng.standard_normal((hq, d), dtype=np.float32)
t0 = time.perf_counter(); calls = 0; best = 1e9
while time.perf_counter() - t0 < float(sys.argv[1]):
    t = time.perf_counter(); c.attend(q, num_threads=1); best = min(best, time.perf_counter() - t); calls += 1
print(f"1 thread: best {best*1e3:.3f} ms, {calls} calls")
