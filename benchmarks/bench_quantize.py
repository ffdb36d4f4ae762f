"""Quantiser and Hadamard throughput per ISA.

quantize: one group per format; bytes = the float32 K and V read plus the
record written; extra_info has tiles/s and µs per tile. The quantise share of a generated token is
measured in bench_attend.py (test_quantize_share): the KVCache.append that completes a tile for every
kv head of one layer, divided by G, against one layer's decode attention call, same threads, one run.
"""
import numpy as np
import pytest

import kvarn
from kvarn import _ops

from conftest import QUICK, THREADS, record

ISAS = kvarn.available_isas()
N_TILES = 32 if QUICK else 128


@pytest.fixture(scope="module", autouse=True)
def restore():
    isa = kvarn.active_isa()
    yield
    kvarn.set_isa(isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("preset", ["k4v2_g128"])
@pytest.mark.parametrize("threads", sorted({1, THREADS}))
def test_quantize(benchmark, preset, head_dim, isa, threads):
    p = _ops.get_preset(preset)
    rng = np.random.default_rng(1)
    n = N_TILES  # same count on every ISA: the group's times compare directly
    k = rng.standard_normal((n, p.group, head_dim), dtype=np.float32)
    k[..., :4] *= 8
    v = rng.standard_normal((n, p.group, head_dim), dtype=np.float32)
    kvarn.set_isa(isa)
    benchmark.group = f"quantize {preset} D={head_dim} threads={threads}"
    fn = lambda: _ops.quantize_tiles_native(k, v, p, _ops.SINKHORN_ITERS, threads)  # noqa: E731
    rec = benchmark.pedantic(fn, rounds=3, iterations=1, warmup_rounds=1)
    nbytes = k.nbytes + v.nbytes + rec.nbytes
    st = benchmark.stats.stats
    record(benchmark, nbytes, impl=f"quantize-{isa}", tiles_per_s=round(n / st.min, 1), us_per_tile=round(st.min / n * 1e6, 2))
    kvarn.set_isa("scalar")
    ref = _ops.quantize_tiles_native(k[:4], v[:4], p, _ops.SINKHORN_ITERS, 1)
    assert np.array_equal(rec[:4], ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_hadamard(benchmark, head_dim, isa):
    rows = 65536
    x = np.random.default_rng(2).standard_normal((rows, head_dim), dtype=np.float32)
    kvarn.set_isa(isa)
    benchmark.group = f"hadamard D={head_dim} rows={rows}"
    out = benchmark.pedantic(kvarn.hadamard, args=(x,), rounds=5, iterations=1, warmup_rounds=1)
    record(benchmark, 2 * x.nbytes, impl=f"hadamard-{isa}")
    kvarn.set_isa("scalar")
    assert np.array_equal(out, kvarn.hadamard(x))
