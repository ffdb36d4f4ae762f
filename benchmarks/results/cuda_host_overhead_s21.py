# Host-side cost of PagedKVCache.attend(q, plan=..., validate=False) with kvarn._cuda replaced by tests/test_cuda.py FakeCuda
# (kernels are no-ops): python cuda_host_overhead_s21.py BATCH LABEL, with PYTHONPATH at a build whose kvarn/cuda.py is under test.
import sys, time, numpy as np
sys.path.insert(0, "/work/main/tests")
import kvarn, kvarn.cuda as kc
from test_cuda import FakeCuda, FakeDevArray
f = FakeCuda(); kc._cuda = f
B = int(sys.argv[1])
cache = kc.PagedKVCache(8, 128, max_seqs=B, max_seq_len=4096)
ids = [cache.add_sequence() for _ in range(B)]
rng = np.random.default_rng(0)
k = FakeDevArray(f, rng.standard_normal((B, 300, 8, 128)).astype(np.float16))
try:
    cache.append(ids, k, k)
except TypeError:
    cache.append(k, k, ids)
plan = cache.plan(ids)
q = FakeDevArray(f, rng.standard_normal((B, 32, 128)).astype(np.float16))
out = FakeDevArray(f, np.zeros((B, 32, 128), np.float16))
fn = lambda: cache.attend(q, plan=plan, out=out, validate=False)
fn()
best = 1e9
for r in range(5):
    t = time.perf_counter(); n = 2000
    for _ in range(n): fn()
    best = min(best, (time.perf_counter() - t) / n)
print(sys.argv[2], "B", B, "host us per attend(plan)", round(best * 1e6, 2))
