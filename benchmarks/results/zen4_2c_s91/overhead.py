# Fifty-first session: the Python + wrapper cost of a decode call, per call and per cache of a batch (min over 7
# repeats of N calls; microseconds). Run over two builds alternately by overhead_ab.sh.
import timeit
import numpy as np
import kvarn

rng = np.random.default_rng(0)


def best(f, number):
    return min(timeit.repeat(f, number=number, repeat=7)) / number * 1e6


def kv(n, hk=3, d=64):
    return rng.standard_normal((hk, n, d)).astype(np.float16)


k1 = kv(1)
q = rng.standard_normal((9, 64)).astype(np.float32)
c = kvarn.KVCache(3, 64)
c.append(k1, k1)
f = kvarn.FP16Cache(3, 64)
f.append(k1, k1)
rows = {"attend, a 1-token cache, 1 thread": best(lambda: kvarn.attend(q, c, num_threads=1), 3000),
        "FP16Cache.attend, 1 token, 1 thread": best(lambda: f.attend(q, num_threads=1), 3000)}
for B in (16, 64):
    caches = []
    for _ in range(B):
        x = kvarn.KVCache(3, 64)
        x.append(k1, k1)
        caches.append(x)
    qb = rng.standard_normal((B, 9, 64)).astype(np.float32)
    rows[f"attend_batch, {B} 1-token caches, 1 thread, per cache"] = best(
        lambda: kvarn.attend_batch(qb, caches, num_threads=1), 200) / B
c2 = kvarn.KVCache(3, 64)
k200 = kv(200)
c2.append(k200, k200)


def step():  # a decode step's cache work: append one token, attend (stays in the tail: 200 -> 250 of 256)
    for _ in range(50):
        c2.append(k1, k1)
        kvarn.attend(q, c2, num_threads=1)
    c2.truncate(200)


rows["append + attend per step, 200-250 tokens, 1 thread"] = best(step, 20) / 50
big = kvarn.KVCache(3, 64)
k1k = kv(1024)
big.append(k1k, k1k)
for t in (1, 2):
    rows[f"attend, 1K tokens (SmolLM2 shape), {t} thread(s)"] = best(lambda: kvarn.attend(q, big, num_threads=t), 500)
batch = []
for _ in range(16):
    x = kvarn.KVCache(3, 64)
    x.append(k1k, k1k)
    batch.append(x)
q16 = rng.standard_normal((16, 9, 64)).astype(np.float32)
rows["attend_batch, 16 caches of 1K tokens, 2 threads, per cache"] = best(
    lambda: kvarn.attend_batch(q16, batch, num_threads=2), 100) / 16
for name, us in rows.items():
    print(f"{name:60s} {us:8.2f}")
