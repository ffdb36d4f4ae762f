"""Behaviour a report-only mutation audit (h41) could change without any test failing: each test here fails on
one such mutant (named in the test's comment) and passes on the code as it is."""
from __future__ import annotations

import math
import re
import struct

import numpy as np
import pytest

import kvarn
from kvarn import _ops

D = 64


@pytest.fixture
def cache():
    rng = np.random.default_rng(7)
    c = kvarn.KVCache(2, D, "k4v2_g64", sink_tokens=64)
    c.append(rng.standard_normal((2, 200, D)).astype(np.float16), rng.standard_normal((2, 200, D)).astype(np.float16))
    return c


def test_a_negative_scale_is_bounded_like_a_positive_one(cache):
    q = np.ones((4, D), np.float32)
    limit = _ops.FLOAT32_MAX / (D * 2.0**17)
    for scale in (2 * limit, -2 * limit):  # abs(scale): a negative scale overflows the scores alike (ops09)
        with pytest.raises(ValueError, match="could overflow the float32 attention scores"):
            kvarn.attend(q, cache, scale=scale)
    for scale in (3.5e38, -3.5e38):  # beyond float32 either way (ops11)
        with pytest.raises(ValueError, match="scale: .* beyond the float32 range"):
            kvarn.attend(np.zeros((4, D), np.float32), cache, scale=scale)


def test_queries_need_heads_and_the_cache_head_dim(cache):
    with pytest.raises(ValueError, match="0 query heads is not a positive multiple"):  # ops10
        kvarn.attend(np.zeros((0, D), np.float32), cache)
    with pytest.raises(ValueError, match=f"last dimension {D + 16} does not match the cache's head_dim {D}"):  # ops27
        kvarn.attend(np.zeros((4, D + 16), np.float32), cache)


def test_attend_batch_refuses_an_empty_cache_and_another_head_dim(cache):
    q = np.zeros((2, 4, D), np.float32)
    with pytest.raises(ValueError, match=r"caches\[1\]: the cache is empty"):  # ops18
        kvarn.attend_batch(q, [cache, kvarn.KVCache(2, D, "k4v2_g64")])
    other = kvarn.KVCache(2, 2 * D, "k4v2_g64")
    other.append(np.zeros((2, 1, 2 * D), np.float16), np.zeros((2, 1, 2 * D), np.float16))
    with pytest.raises(ValueError, match=r"caches\[1\]: 2 kv heads x 128 does not match caches\[0\]'s 2 x 64"):  # ops20
        kvarn.attend_batch(q, [cache, other])


def test_presets_hold_the_bits_and_tile_their_names_say():
    for name, p in kvarn.PRESETS.items():  # ops16 (k2v2_g128 with 4-bit values)
        kbits, vbits, group = map(int, re.fullmatch(r"k(\d)v(\d)_g(\d+)", name).groups())
        assert (p.name, p.kbits, p.vbits, p.group) == (name, kbits, vbits, group)


def test_balance_scales_needs_two_rows_and_two_columns():
    for shape in ((1, 8), (8, 1)):  # ops23
        with pytest.raises(ValueError, match="x: needs at least 2 rows and 2 columns"):
            _ops.balance_scales(np.ones(shape, np.float32))
    r, c = _ops.balance_scales(np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32))
    assert r.shape == (2,) and c.shape == (8,)


def test_tile_bytes_naming_zero_heads_are_refused():
    rng = np.random.default_rng(1)
    tile = kvarn.quantize_tile(rng.standard_normal((2, 64, D)).astype(np.float32),
                               rng.standard_normal((2, 64, D)).astype(np.float32), "k4v2_g64")
    blob = bytearray(tile.to_bytes())
    fields = list(struct.unpack_from("<8sBBBHHIB", blob))
    assert fields[5] == D and fields[6] == 2  # head_dim, heads
    fields[6] = 0
    struct.pack_into("<8sBBBHHIB", blob, 0, *fields)
    with pytest.raises(ValueError, match="data: header names zero heads"):  # tile09
        kvarn.Tile.from_bytes(bytes(blob))


def test_fp16_cache_nbytes_counts_keys_and_values():
    c = kvarn.FP16Cache(3, D)
    c.append(np.zeros((3, 5, D), np.float16), np.zeros((3, 5, D), np.float16))
    assert c.nbytes == 2 * 2 * 3 * D * 5  # K and V, two bytes each (fp05)


def test_from_parts_checks_the_sink(cache):
    parts = cache.to_parts()
    tail = parts["tail_k"][:, :3]
    short = dict(parts, sink_k=parts["sink_k"][:, :10], sink_v=parts["sink_v"][:, :10],
                 records=parts["records"][:0], tail_k=tail, tail_v=parts["tail_v"][:, :3])
    with pytest.raises(ValueError, match="sink_k: 10 of 64 sink tokens, yet tiles or tail tokens follow"):  # cache12
        kvarn.KVCache.from_parts(**short)
    long = dict(parts, sink_k=np.concatenate([parts["sink_k"]] * 2, 1), sink_v=np.concatenate([parts["sink_v"]] * 2, 1))
    with pytest.raises(ValueError, match="sink_k: 128 tokens is more than sink_tokens=64"):  # cache22
        kvarn.KVCache.from_parts(**long)
    big = dict(parts, sink_k=parts["sink_k"].astype(np.float32) * 0 + 1e5)
    with pytest.raises(ValueError, match="sink_k"):  # beyond fp16 (cache21)
        kvarn.KVCache.from_parts(**big)



def test_fp16_cache_grows_geometrically():
    """Token-by-token appends reallocate O(log n) times, not at every token (growing to exactly what is needed
    made a decode loop copy the whole cache per token: quadratic, with identical results)."""
    c = kvarn.FP16Cache(1, 16)
    one = np.zeros((1, 1, 16), np.float16)
    grown, buffer = 0, None
    for _ in range(2000):
        c.append(one, one)
        if c._state[0] is not buffer:  # the previous buffer stays referenced: no id reuse to fool the count
            grown, buffer = grown + 1, c._state[0]
    assert len(c) == 2000 and grown <= 2 * math.ceil(math.log2(2000))  # 4 now (256 ... 2048 tokens); ~2000 if not
