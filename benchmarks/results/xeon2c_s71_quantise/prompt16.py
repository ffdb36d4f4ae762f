import sys, numpy as np, time
sys.path.insert(0, sys.argv[1])
import kvarn
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 32768, 128)).astype(np.float16)
ts = []
for r in range(7):
    c = kvarn.FP16Cache(8, 128)
    c.append(x[:, :1], x[:, :1])
    t = time.perf_counter(); c.append(x, x); ts.append(time.perf_counter() - t)
print(f"FP16Cache 32K-token fp16 prompt append (8x128): min {min(ts)*1e3:.2f} ms, median {np.median(ts)*1e3:.2f} ms")
