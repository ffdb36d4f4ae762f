import os, time, numpy as np, kvarn
hk, hq, D = map(int, os.environ.get("SHAPE", "3,9,64").split(","))
n = 32768
kvarn.set_num_threads(1)
rng = np.random.default_rng(0)
c = kvarn.KVCache(hk, D)
for i in range(0, n, 4096):
    c.append(rng.standard_normal((hk, 4096, D)).astype(np.float16), rng.standard_normal((hk, 4096, D)).astype(np.float16))
q = rng.standard_normal((hq, D)).astype(np.float32)
t = time.perf_counter(); k = 0
while time.perf_counter() - t < float(os.environ.get("SECS", "8")):
    kvarn.attend(q, c); k += 1
print(k, (time.perf_counter() - t) / k * 1e3, "ms")
if os.environ.get("SAMPLER_OUT"):  # sampler.c: the mappings while the module is loaded
    with open("/proc/self/maps") as src, open(os.environ["SAMPLER_OUT"] + ".maps", "w") as dst:
        dst.write(src.read())
