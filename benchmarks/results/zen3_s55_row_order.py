# The review's (h21) row-order check: does the row before kvarn's (torch-folded SDPA, numpy) change kvarn's per-row minimum as bench_attend times it? Run: python zen3_s55_row_order.py 32768 1
# Does the row before kvarn's (the previous group's torch / numpy rows) change kvarn's minimum?
# Emulates bench_attend: 1 probe + 1 warm-up + N timed calls, min; preceded by (a) a torch-folded SDPA row,
# (b) a numpy row, (c) 0.5 s idle. Interleaved blocks.
import os, sys, time
T = 2
for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"): os.environ[v] = str(T)
import numpy as np, kvarn, torch
kvarn.set_num_threads(T); torch.set_num_threads(T)
sys.path.insert(0, "/work/main/benchmarks")
hq, hk, d = 32, 8, 128
ctx, batch = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(ctx)
k = rng.standard_normal((hk, ctx, d), dtype=np.float32); k[..., :4] *= 8; k = k.astype(np.float16)
v = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
c = kvarn.KVCache(hk, d); c.append(k, v)
caches = [c] + [c.copy() for _ in range(batch - 1)]
q = np.ascontiguousarray(rng.standard_normal((batch, hq, d), dtype=np.float32))
K = np.ascontiguousarray(np.broadcast_to(k.astype(np.float32), (batch,) + k.shape)); V = np.ascontiguousarray(np.broadcast_to(v.astype(np.float32), (batch,) + v.shape))
tq, tk, tv = torch.from_numpy(q).reshape(batch, hk, hq // hk, d), torch.from_numpy(K), torch.from_numpy(V)
scale = float(1 / np.sqrt(d))
def kv(): kvarn.attend_batch(q, caches, num_threads=T)
def tf():
    with torch.inference_mode(): torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, scale=scale)
def npy():
    qg = q.reshape(batch, hk, hq // hk, d); s = np.matmul(qg, K.transpose(0, 1, 3, 2)) * np.float32(scale)
    s -= s.max(-1, keepdims=True); np.exp(s, out=s); s /= s.sum(-1, keepdims=True); np.matmul(s, V)
def row(fn, n):
    fn(); fn(); ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts)
N = int(sys.argv[3]) if len(sys.argv) > 3 else 50
res = {"after torch-folded": [], "after numpy": [], "after 0.5 s idle": []}
for rep in range(int(sys.argv[4]) if len(sys.argv) > 4 else 4):
    for label in res:
        if label == "after torch-folded": row(tf, 20)
        elif label == "after numpy": row(npy, 10)
        else: time.sleep(0.5)
        res[label].append(row(kv, N))
for label, xs in res.items():
    print(f"ctx {ctx} b{batch}: kvarn min {label:20s}: " + " ".join(f"{x*1e3:.3f}" for x in xs) + f"  | median {np.median(xs)*1e3:.3f} ms")
