"""Quantiser and Hadamard throughput per ISA.

quantize: one group per format; bytes = the float32 K and V read plus the
record written; extra_info has tiles/s and µs per tile. The quantise share of a generated token is
measured in bench_attend.py (test_quantize_share): the KVCache.append that completes a tile for every
kv head of one layer, divided by G, against one layer's decode attention call, same threads, one run.
"""
import os
import sys

import numpy as np
import pytest

import kvarn
from kvarn import _ops

from conftest import QUICK, THREADS, record

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import oracle  # noqa: E402  (the float64 SPEC oracle: every row's output is checked against it, scalar too)


def check_against_oracle(record_bytes, k, v, p, head_dim):
    """One tile's record against the float64 oracle's quantisation of the same K, V, read with the
    oracle's own parser: codes equal but for rounding near-ties, scale vectors within 2e-3 (the
    check tests/test_quantize.py applies)."""
    f = oracle.record_fields(record_bytes, p.kbits, p.vbits, p.group, head_dim)
    oracle.assert_fields_match_oracle(f, oracle.quantize_tile(k, v, p.kbits, p.vbits))

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
    assert np.array_equal(rec[:4], ref)  # every ISA writes the scalar path's bytes
    check_against_oracle(rec[0], k[0], v[0], p, head_dim)  # and the scalar path follows SPEC


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
    ref = oracle.rotate(x[:256])  # float64 matrix product with the oracle's Sylvester matrix
    np.testing.assert_allclose(out[:256], ref, rtol=0, atol=1e-5 * np.abs(ref).max())
