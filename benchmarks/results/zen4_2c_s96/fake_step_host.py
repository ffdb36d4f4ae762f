"""Fifty-sixth session: host time of a one-token PagedKVCache.checkpoint + append_attend(validate=False, flags=)
(KVarNCache's per-layer step) on FakeCuda (tests/test_cuda.py, its kernels and copies made no-ops): the Python side
alone, Hq 32 / Hk 8 / D 128, one sequence; median of 3000 calls. Run with PYTHONPATH at a kvarn build (A/B: two
builds, one with the older cuda.py). Pass any argument for a cProfile."""
import cProfile, os, pstats, sys, time, statistics
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests"))
import kvarn.cuda as kc
from test_cuda import FakeCuda, FakeDevArray

class NoopCuda(FakeCuda):
    def memcpy_htod(self, dst, src, stream): return 0
    def memset(self, ptr, value, n, stream): return 0
    def check(self, *a): return 0
    def store(self, *a): return 0
    def write_tokens(self, *a): return 0
    def attend(self, *a): return 0
    def pointer_device(self, ptr): return 0, 2, 0
fake = NoopCuda()
kc._cuda = fake
HK, HQ, D, N = 8, 32, 128, 16384
cache = kc.PagedKVCache(HK, D, max_seqs=1, max_seq_len=N + 20000)
s = cache.add_sequence()
rng = np.random.default_rng(0)
big = rng.standard_normal((1, 200, HK, D)).astype(np.float16)
cache.append([s], FakeDevArray(fake, big), FakeDevArray(fake, big))
q = FakeDevArray(fake, rng.standard_normal((1, 1, HQ, D)).astype(np.float16))
k = FakeDevArray(fake, rng.standard_normal((1, 1, HK, D)).astype(np.float16))
v = FakeDevArray(fake, rng.standard_normal((1, 1, HK, D)).astype(np.float16))
flags = FakeDevArray(fake, np.zeros(1, np.int32))
def step():
    cache.checkpoint([s], 1)
    cache.append_attend(q, [s], k, v, validate=False, flags=flags)
ts = []
for _ in range(3000):
    t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
print("median us", 1e6 * statistics.median(ts))
if len(sys.argv) > 1:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): step()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(30)
