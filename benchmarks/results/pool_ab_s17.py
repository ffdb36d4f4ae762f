import sys, time, numpy as np, kvarn
kvarn.set_num_threads(16)
rng = np.random.default_rng(0)
def build(n):
    c = kvarn.KVCache(8, 128)
    c.append(rng.standard_normal((8, n, 128)).astype(np.float32), rng.standard_normal((8, n, 128)).astype(np.float32))
    return c
c32 = build(32768); c1 = build(1024)
batch = [c32] + [c32.copy() for _ in range(15)]
q1 = rng.standard_normal((32, 128)).astype(np.float32); qb = rng.standard_normal((16, 32, 128)).astype(np.float32)
def best(fn, secs=1.0):
    fn(); t0 = time.perf_counter(); m = 1e9
    while time.perf_counter() - t0 < secs:
        t = time.perf_counter(); fn(); m = min(m, time.perf_counter() - t)
    return m * 1e3
print(sys.argv[1], "1K b1 %.4f  32K b1 %.4f  32K b16 %.3f ms" % (best(lambda: kvarn.attend(q1, c1)), best(lambda: kvarn.attend(q1, c32)),
      best(lambda: kvarn.attend_batch(qb, batch))), flush=True)
