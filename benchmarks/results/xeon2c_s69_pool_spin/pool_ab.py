"""The adaptive pool spin on another machine: one process per build (argv[1]: its site folder), kvarn
threads = all cores. (a) back-to-back attend calls, (b) each attend after torch work on the same threads
(a model's projections: three fp32 matvecs over 4096 x 4096 weights), both at Hq 32 / Hk 8 / D 128.
Prints medians and minima in ms."""
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, torch, kvarn

threads = kvarn.get_num_threads()
torch.set_num_threads(threads)
rng = np.random.default_rng(0)
w = [torch.randn(4096, 4096) for _ in range(3)]
x = torch.randn(1, 4096)
for ctx in (1024, 32768):
    c = kvarn.KVCache(8, 128)
    c.append(rng.standard_normal((8, ctx, 128)).astype(np.float16), rng.standard_normal((8, ctx, 128)).astype(np.float16))
    q = rng.standard_normal((32, 128)).astype(np.float32)
    for _ in range(20):
        kvarn.attend(q, c)
    b2b = []
    for _ in range(200 if ctx == 1024 else 60):
        t = time.perf_counter(); kvarn.attend(q, c); b2b.append(time.perf_counter() - t)
    att, step = [], []
    for _ in range(100 if ctx == 1024 else 40):
        t0 = time.perf_counter()
        for m in w:
            y = x @ m
        t1 = time.perf_counter(); kvarn.attend(q, c); t2 = time.perf_counter()
        att.append(t2 - t1); step.append(t2 - t0)
    med = lambda a: sorted(a)[len(a) // 2] * 1e3  # noqa: E731
    print(f"{sys.argv[1].rstrip('/').split('/')[-1]} threads {threads} ctx {ctx}: back-to-back median {med(b2b):.3f} "
          f"min {min(b2b)*1e3:.3f} ms; after torch: attend median {med(att):.3f} min {min(att)*1e3:.3f} ms, "
          f"torch + attend median {med(step):.3f} ms")
