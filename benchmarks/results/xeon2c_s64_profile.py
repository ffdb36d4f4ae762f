"""Twenty-fourth session, the 2-core Xeon: one thread of kvarn.attend at the headline 32K point (Hq 32, Hk 8, D 128,
k4v2_g128), for perf (an unstripped build: -C cmake.define.CMAKE_CXX_FLAGS=-g -C install.strip=false). Usage:
perf record python xeon2c_s64_profile.py 1; perf report --sort dso,symbol (xeon2c_s64_profile.log)."""
import numpy as np, kvarn, time, sys
rng = np.random.default_rng(0)
hk, hq, D, n = 8, 32, 128, 32768
c = kvarn.KVCache(hk, D)
k = rng.standard_normal((hk, n, D)).astype(np.float32); k[..., :4] *= 8
c.append(k, rng.standard_normal((hk, n, D)).astype(np.float32))
q = rng.standard_normal((hq, D)).astype(np.float32)
th = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for _ in range(3): kvarn.attend(q, c, num_threads=th)
t = time.perf_counter(); N = 300
for _ in range(N): kvarn.attend(q, c, num_threads=th)
dt = (time.perf_counter() - t) / N
print(f"{kvarn.active_isa()} {kvarn.score_mode()} threads {th}: {dt*1e3:.3f} ms/call, {dt*1e6/(n//128*hk):.3f} us per record")
