# Seventeenth session: kvarn.attend (32K, Hq 32 / Hk 8 / D 128, 2 threads) right after other thread pools ran:
# torch (intra-op pool) and numpy (OpenBLAS) workers keep spinning for a while after their own call.
import time, numpy as np, kvarn, torch, sys
torch.set_num_threads(2)
rng = np.random.default_rng(0)
Hk, Hq, D, N = 8, 32, 128, 32768
c = kvarn.KVCache(Hk, D)
c.append(rng.standard_normal((Hk, N, D)).astype(np.float32), rng.standard_normal((Hk, N, D)).astype(np.float32))
q = rng.standard_normal((Hq, D)).astype(np.float32)
a = torch.empty(64 << 20); b = torch.empty_like(a)
def series(label):
    ts = []
    for r in range(60):
        t = time.perf_counter(); c.attend(q, num_threads=2); ts.append(time.perf_counter() - t)
    ts = np.array(ts) * 1e3
    print(f"{label}: first5 {np.round(ts[:5],2)} min {ts.min():.2f} median {np.median(ts):.2f}")
series("plain")
b.copy_(a); series("after torch copy")
time.sleep(0.5); series("after sleep")
x = np.random.rand(2000, 2000).astype(np.float32); x @ x; series("after numpy matmul")
