"""Fifty-seventh session: where append_attend's one-token decode path (Python ints, _decode_rows) stops paying
against the general path (numpy), by batch size: FakeCuda (tests/test_cuda.py, its kernels and copies no-ops), the
Python side alone, Hq 32 / Hk 8 / D 128, one-token steps with deferred flags; in one process, alternating blocks of
300 steps with kvarn.cuda._DECODE_ROWS at 4096 (decode path) and 0 (general path); medians of 6 blocks each."""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests"))
import kvarn.cuda as kc  # noqa: E402
from test_cuda import FakeCuda, FakeDevArray  # noqa: E402


class NoopCuda(FakeCuda):
    def memcpy_htod(self, dst, src, stream): return 0
    def memset(self, ptr, value, n, stream): return 0
    def check_many(self, *a): return 0
    def store(self, *a): return 0
    def write_tokens(self, *a): return 0
    def attend(self, *a): return 0
    def pointer_device(self, ptr): return 0, 2, 0


fake = NoopCuda()
kc._cuda = fake
HK, HQ, D = 8, 32, 128
rng = np.random.default_rng(0)
for B in (1, 4, 8, 16, 32, 64, 128):
    cache = kc.PagedKVCache(HK, D, max_seqs=B, max_seq_len=8192)
    seqs = [cache.add_sequence() for _ in range(B)]
    prompt = rng.standard_normal((B, 200, HK, D)).astype(np.float16)
    cache.append(seqs, FakeDevArray(fake, prompt), FakeDevArray(fake, prompt))
    q = FakeDevArray(fake, rng.standard_normal((B, 1, HQ, D)).astype(np.float16))
    k = FakeDevArray(fake, rng.standard_normal((B, 1, HK, D)).astype(np.float16))
    flags = FakeDevArray(fake, np.zeros(1, np.int32))
    blocks = {4096: [], 0: []}
    for r in range(12):
        rows = 4096 if r % 2 == 0 else 0
        kc._DECODE_ROWS = rows
        times = []
        for _ in range(300):
            if int(cache._lengths.max()) > 8000:
                for s in seqs:
                    cache.truncate(s, 200)
            t0 = time.perf_counter()
            cache.append_attend(q, seqs, k, k, validate=False, flags=flags)
            times.append(time.perf_counter() - t0)
        blocks[rows].append(1e6 * statistics.median(times))
    new, old = statistics.median(blocks[4096]), statistics.median(blocks[0])
    print(f"batch {B:3d}: decode path {new:7.1f} us, general path {old:7.1f} us, ratio {new / old:.3f}", flush=True)
