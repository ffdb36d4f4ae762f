"""A hypothesis state machine for kvarn.KVCache against a plain numpy model.

The model keeps every token a cache was given, rounded to fp16 as the cache stores it (SPEC §7 and
cache.py: inputs of any float dtype are kept as their fp16 rounding), and the number of quantised
tiles. Settings are drawn per example: 1-2 kv heads, head_dim 16 or 64, 64-token presets (k4v2, k4v4
and custom k2v2, k8v2), sink_tokens 0-70, quantize_on "fill" or "next", iters 8 or 3, the kernels'
ISA, a key scale and an initial prompt. Rules append chunks of drawn lengths (0, 1, odd, ending on /
crossing one or several tile boundaries, a whole prompt; fp16 / float32 / float64 / mixed dtypes,
contiguous or strided; 1 or 2 threads), truncate (to a length truncate accepts; through the documented
truncation_point recipe; to lengths it must refuse), take checkpoints and roll back to any of them
(also a speculative decoder's draft / reject / accept / back-to-the-draft step, and an audit that
every held checkpoint still restores its content), copy (copy(), copy.copy, copy.deepcopy, pickle;
also a copy and the original then given different tokens), round-trip through to_parts / from_parts,
take decode steps through append_attend (one token, its own path, or three) against a copy given the
tokens one at a time with an attend after each, and refused one-token steps (NaN / Inf, a bad query),
and make appends that must be refused (NaN, Inf, beyond fp16, wrong dtype, shape, heads, head_dim,
rank; valid input whose all-60000 tile overflows its fp16 scales) and must leave the cache exactly as
it was (sizes, parts, records, dequantisation, repr, an attention output). Up to three caches live at
once (copies of each other), so every step also checks that the others did not change.

After every step, for every live cache:
- len, sink_len, num_tiles, tail_len, nbytes and the records' shape are what SPEC §7 gives for the
  model's tokens (the tile count is tracked by the model: with quantize_on="next" a truncate to a
  tile's end leaves that tile quantised, as truncate documents);
- to_parts()'s sink and tail equal the model's fp16 rows exactly;
- every record equals, byte for byte, kvarn.quantize_tile of the model's fp16 rows of that tile;
- attend on a random query (in the exact float score mode and in an integer one, under a drawn ISA)
  matches float64 attention over the cache's own records decoded by the oracle (tests/oracle.py) with
  the sink and tail from the model (MODE_RTOL below).
Checkpoints report the length they were taken at. A run of the whole file takes a few seconds.
"""
import copy
import pickle
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvarn
import oracle

# attend against float64 attention over the dequantised cache: the L2 error relative to the p-weighted
# norm of the values summed (oracle.attention_with_value_norm, as test_cuda compares; relative to |ref|,
# test_cache's measure, an output that cancels to far below the values makes fp32's own error look
# large: 1.4e-5 on a 429-token cache with one spiky token). The exact "float" score mode: 1e-5, the
# bound of the tests that run it (the `isa` fixture); measured here at most 3.2e-6 over 800 random
# draws (head_dim 16 and 64, every key scale below). The integer modes: test_simd's one-draw bounds,
# 1.5e-3 (int16: measured at most 2.7e-4 here) and 0.12 (int8).
MODE_RTOL = {"float": 1e-5, "int16": 1.5e-3, "int8": 0.12}

PRESETS = ["k4v2_g64", "k4v4_g64", kvarn.Preset("k2v2_g64", 2, 2, 64), kvarn.Preset("k8v2_g64", 8, 2, 64)]
MAX_TOKENS = 1000  # appends are clipped here: keeps a step's checks cheap
MAX_CACHES = 3
MAX_CHECKPOINTS = 4
IDX = st.integers(0, 7)  # picks a live cache / checkpoint, modulo how many there are
SEEDS = st.integers(0, 2**32 - 1)
DTYPES = st.sampled_from([("float16", "float16"), ("float32", "float32"), ("float64", "float64"),
                          ("float32", "float16"), ("float64", "float32")])
LAYOUTS = st.sampled_from(["contiguous", "contiguous", "transposed", "strided"])
SCALES = st.sampled_from([1.0, 1.0, 0.05, 30.0, 1e-4])  # one per machine: a key spike far above the rest
# is another test's subject (float32 scores near it err by more than the bounds below allow)
THREADS = st.sampled_from([None, 1, 2])
AIMS = st.sampled_from(["anywhere", "near the end", "a tile's end", "next to a tile's end"])  # truncate lengths
DRAFTS = ["few", "few", "past a tile's end", "past a tile's end", "any"]  # speculate's token counts
APPEND_ARGS = dict(i=IDX, extra=st.integers(0, 250), seed=SEEDS, dtypes=DTYPES, layout=LAYOUTS, threads=THREADS)

# Memos: a record's reference bytes by its tokens' fp16 bytes, and the oracle's decoding by the record's
# bytes. The caches of one example hold the same tiles many times over (copies, checkpoints, re-appends).
_RECORD_MEMO, _DECODE_MEMO = {}, {}


def _memo(memo, key, make):
    if key not in memo:
        if len(memo) > 20000:
            memo.clear()
        memo[key] = make()
    return memo[key]


def reference_records(k16, v16, preset, iters):
    """kvarn.quantize_tile of one tile's fp16 rows [H, G, D], all heads: uint8 [H, record_bytes]."""
    key = (kvarn.active_isa(), repr(preset), iters, k16.shape, k16.tobytes(), v16.tobytes())
    return _memo(_RECORD_MEMO, key, lambda: kvarn.quantize_tile(k16, v16, preset, iters=iters).records.copy())


def decoded_record(rec, kbits, vbits, group, head_dim):
    """oracle.dequantize_record, memoised: float64 (K̂, V̂) [G, D] of one record (shares no code with the C++)."""
    key = (kbits, vbits, group, head_dim, rec.tobytes())
    return _memo(_DECODE_MEMO, key, lambda: oracle.dequantize_record(rec, kbits, vbits, group, head_dim))


def make_chunk(seed, H, n, D, dtypes, layout, scale):
    """k, v [H, n, D] in the given dtypes and memory layout (keys with a few large channels); seed: an
    int or a list of ints (numpy's SeedSequence)."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((H, n, D)) * scale
    k[..., rng.choice(D, size=min(4, D), replace=False)] *= 8.0
    v = rng.standard_normal((H, n, D)) * scale
    out = []
    for x, dt in zip((k, v), dtypes):
        x = x.astype(dt)
        if layout == "transposed":  # an F-order-like view: tokens are not contiguous
            x = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)
        elif layout == "strided":  # every other channel of a wider array
            wide = np.zeros((H, n, 2 * D), dt)
            wide[..., ::2] = x
            x = wide[..., ::2]
        out.append(x)
    return out


def observe(cache, q):
    """Everything observable about a cache (for 'unchanged' checks): sizes, bytes, parts, records,
    its dequantisation, its repr and an attention output (one thread: bit-reproducible)."""
    parts = cache.to_parts()
    obs = [len(cache), cache.sink_len, cache.num_tiles, cache.tail_len, cache.nbytes, cache.allocated_nbytes,
           repr(cache), cache.records.tobytes(), cache.records.shape]
    obs += [(name, x.dtype.str, x.shape, x.tobytes()) if isinstance(x, np.ndarray) else (name, repr(x))
            for name, x in sorted(parts.items())]
    obs += [x.tobytes() for x in cache.dequantize()]
    if len(cache):
        obs.append(kvarn.attend(q, cache, num_threads=1).tobytes())
    return obs


def expect(ok, message):
    """assert, without pytest's rewriting: its diff of two long byte strings (difflib) took ~10 s per
    failing replay, and shrinking replays a failure hundreds of times."""
    if not ok:
        raise AssertionError(message)


def first_difference(a, b):
    """Where fp16 rows [H, n, D] a and b first differ: (head, token, channel)."""
    return tuple(int(x[0]) for x in np.nonzero(a.view(np.uint16) != b.view(np.uint16)))


def assert_observed_same(before, after, what):
    expect(len(before) == len(after), f"{what}: len {before[0]} -> {after[0]}")
    for i, (a, b) in enumerate(zip(before, after)):
        expect(a == b, f"{what}: observable item {i} changed ({str(a)[:80]} -> {str(b)[:80]})")


class Entry:
    """A live cache and its model: fp16 tokens k, v [H, n, D] (never written in place: replaced), the
    tile count, and the cache's checkpoints with the model state each returns to."""

    def __init__(self, cache, k, v, tiles):
        self.cache, self.k, self.v, self.tiles = cache, k, v, tiles
        self.checkpoints = []  # (Checkpoint, k, v, tiles)

    def __len__(self):
        return self.k.shape[1]


class KVCacheMachine(RuleBasedStateMachine):
    # ---- settings -----------------------------------------------------------------------------
    @initialize(H=st.sampled_from([1, 2]), D=st.sampled_from([16, 64]), preset=st.sampled_from(PRESETS),
                sink=st.sampled_from([None, 0, 1, 5, 64, 70]), quantize_on=st.sampled_from(["fill", "next"]),
                iters=st.sampled_from([8, 8, 3]), scale=SCALES, isa=st.sampled_from(kvarn.available_isas()),
                int_mode=st.sampled_from(["int16", "int16", "int8"]), prompt=st.sampled_from([0, 1, 150, 200, 300]),
                seed=SEEDS)
    def setup(self, H, D, preset, sink, quantize_on, iters, scale, isa, int_mode, prompt, seed):
        self.saved_isa_mode = kvarn.active_isa(), kvarn.score_mode()
        kvarn.set_isa(isa)
        self.isa, self.int_mode = isa, int_mode
        self.H, self.D, self.scale = H, D, scale
        cache = kvarn.KVCache(H, D, preset, sink_tokens=sink, iters=iters, quantize_on=quantize_on)
        self.G, self.sink_tokens, self.next = cache.preset.group, cache.sink_tokens, quantize_on == "next"
        self.preset, self.iters = cache.preset, iters
        assert self.sink_tokens == (self.G if sink is None else sink)
        empty = np.zeros((H, 0, D), np.float16)
        self.pool = [Entry(cache, empty, empty, 0)]
        self.rng = np.random.default_rng(seed)
        self.appends = 0
        # A cache with tiles at once: 1-4 of them, in a records buffer of 4 with room for a draft's
        # (the buffer grows to just what a longer prompt needs, then by a quarter, so room is rarer later).
        self.append_tokens(self.pool[0], prompt, seed)

    def teardown(self):
        if hasattr(self, "saved_isa_mode"):
            kvarn.set_isa(self.saved_isa_mode[0])
            kvarn.set_score_mode(self.saved_isa_mode[1])

    # ---- model helpers ----------------------------------------------------------------------
    def entry(self, i) -> Entry:
        return self.pool[i % len(self.pool)]

    def layout(self, e: Entry):
        """(sink_len, tiles, tail_len) the model expects."""
        sink_len = min(len(e), self.sink_tokens)
        return sink_len, e.tiles, len(e) - sink_len - e.tiles * self.G

    def canonical_tiles(self, n):
        """Quantised tiles of a cache that was only ever appended n tokens (SPEC §7; "next" keeps a
        full last tile exact)."""
        body = n - min(n, self.sink_tokens)
        return max(0, body - 1) // self.G if self.next else body // self.G

    def query(self):
        hq = self.H * int(self.rng.choice([1, 2]))
        return self.rng.standard_normal((hq, self.D)).astype(np.float32)

    def add_entry(self, src: Entry, new: Entry, front: bool):
        """Adds a cache made from src's: first in the pool (the caches rules pick most, index 0 being
        hypothesis's favourite draw), or last; the pool keeps src and at most MAX_CACHES caches."""
        self.pool.insert(0 if front else len(self.pool), new)
        if len(self.pool) > MAX_CACHES:
            self.pool.pop(next(n for n in range(len(self.pool) - 1, -1, -1) if self.pool[n] not in (src, new)))

    # ---- appends ----------------------------------------------------------------------------
    # Four rules (hypothesis draws rules uniformly): appends are most of a machine's steps.
    @rule(kind=st.sampled_from(["one", "one", "odd", "zero"]), **APPEND_ARGS)
    def append_decode(self, kind, **kw):
        self.append(kind, **kw)

    @rule(kind=st.sampled_from(["end_tile", "end_tile", "to_sink_end"]), **APPEND_ARGS)
    def append_to_a_boundary(self, kind, **kw):
        self.append(kind, **kw)

    @rule(kind=st.sampled_from(["cross_one", "cross_several"]), **APPEND_ARGS)
    def append_across_tiles(self, kind, **kw):
        self.append(kind, **kw)

    @rule(**APPEND_ARGS)
    def append_prompt(self, **kw):
        self.append("prompt", **kw)

    def append(self, kind, i, extra, seed, dtypes, layout, threads):
        e = self.entry(i)
        G = self.G
        sink_len, _, tail_len = self.layout(e)
        to_sink_end = self.sink_tokens - sink_len
        to_tile_end = to_sink_end + (G - tail_len % G if not to_sink_end else G)  # the next tile boundary
        n = {
            "zero": 0,
            "one": 1,
            "odd": 2 * (extra % 6) + 1,
            "to_sink_end": to_sink_end,
            "end_tile": to_tile_end,
            "cross_one": to_tile_end + 1 + extra % (G - 1),
            "cross_several": to_tile_end + G * (1 + extra % 3) + extra % 7,
            "prompt": 150 + extra,
        }[kind]
        n = max(0, min(n, MAX_TOKENS - len(e)))
        self.append_tokens(e, n, seed, dtypes, layout, threads)

    def append_tokens(self, e, n, seed, dtypes=("float32", "float32"), layout="contiguous", threads=None):
        # Every append's tokens differ, though hypothesis draws seed 0 again and again: a write into a
        # buffer another state shares (a copy's tail, a newer checkpoint's records) must change what it reads.
        self.appends += 1
        k, v = make_chunk([seed, self.appends], self.H, n, self.D, dtypes, layout, self.scale)
        e.cache.append(k, v, num_threads=threads)
        e.k = np.concatenate([e.k, k.astype(np.float16)], axis=1)
        e.v = np.concatenate([e.v, v.astype(np.float16)], axis=1)
        if n:
            e.tiles = self.canonical_tiles(len(e))

    @rule(i=IDX, kind=st.sampled_from(["nan_k", "inf_v", "neginf_k", "nan_v_f16", "inf_k_f16", "beyond_fp16_k",
                                       "beyond_fp16_v", "int_dtype_k", "complex_v", "not_array_k", "heads_both",
                                       "heads_v", "head_dim", "rank", "tokens_v"]),
          n=st.integers(1, 200), seed=SEEDS, threads=THREADS)
    def rejected_append(self, i, kind, n, seed, threads):
        self.refused_append(i, kind, n, seed, threads)

    # Valid input refused late, when a tile is quantised (after the tail may have been written past
    # tail_len and the records buffer grown): with 2-bit values an all-60000 tile overflows v's fp16
    # scales (4- and 8-bit ones hold any fp16-range tile).
    @precondition(lambda self: self.preset.vbits == 2)
    @rule(i=IDX, n=st.integers(1, 200), seed=SEEDS, threads=THREADS)
    def rejected_append_overflowing_a_tile(self, i, n, seed, threads):
        self.refused_append(i, "overflow", n, seed, threads)

    def refused_append(self, i, kind, n, seed, threads):
        """An append that must raise, with a message naming the problem, and change nothing."""
        e = self.entry(i)
        H, D, G = self.H, self.D, self.G
        rng = np.random.default_rng(seed)
        k, v = make_chunk(seed, H, n, D, ("float32", "float32"), "contiguous", 1.0)
        spot = (rng.integers(H), rng.integers(n), rng.integers(D))
        if kind == "nan_k":
            k[spot] = np.nan
            exc, msg = ValueError, "k: contains NaN or Inf"
        elif kind == "inf_v":
            v[spot] = np.inf
            exc, msg = ValueError, "v: contains NaN or Inf"
        elif kind == "neginf_k":
            k = k.astype(np.float64)
            k[spot] = -np.inf
            exc, msg = ValueError, "k: contains NaN or Inf"
        elif kind == "nan_v_f16":
            v = v.astype(np.float16)
            v[spot] = np.nan
            exc, msg = ValueError, "v: contains NaN or Inf"
        elif kind == "inf_k_f16":
            k = k.astype(np.float16)
            k[spot] = np.inf
            exc, msg = ValueError, "k: contains NaN or Inf"
        elif kind == "beyond_fp16_k":
            k[spot] = 7e4
            exc, msg = ValueError, "k: values beyond the fp16 range"
        elif kind == "beyond_fp16_v":
            v = v.astype(np.float64)
            v[spot] = -1e5
            exc, msg = ValueError, "v: values beyond the fp16 range"
        elif kind == "int_dtype_k":
            k = k.astype(np.int32)
            exc, msg = TypeError, "k: dtype int32 is not supported"
        elif kind == "complex_v":
            v = v.astype(np.complex64)
            exc, msg = TypeError, "v: dtype complex64 is not supported"
        elif kind == "not_array_k":
            k = "k"
            exc, msg = TypeError, "k: expected a numpy array"
        elif kind == "heads_both":
            k, v = (np.concatenate([x, x[:1]], axis=0) for x in (k, v))
            exc, msg = ValueError, re.escape(f"k: expected shape [{H}, n, {D}]")
        elif kind == "heads_v":
            v = np.concatenate([v, v[:1]], axis=0)
            exc, msg = ValueError, "v: shape .* does not match k's"
        elif kind == "head_dim":
            k, v = k[..., : D // 2], v[..., : D // 2]
            exc, msg = ValueError, re.escape(f"k: expected shape [{H}, n, {D}]")
        elif kind == "rank":
            k, v = k[0], v[0]
            exc, msg = ValueError, "k: expected a 3-D array"
        elif kind == "tokens_v":
            v = v[:, : n - 1] if n > 1 else np.concatenate([v, v], axis=1)
            exc, msg = ValueError, "v: shape .* does not match k's"
        else:  # "overflow": valid input, refused when its first all-60000 tile is quantised (v's scales)
            sink_len, _, tail_len = self.layout(e)
            to_sink_end = self.sink_tokens - sink_len
            # Past the sink, complete the current tile (or a "next" full tail's following one), then one
            # tile of nothing but 60000s, then n % G more.
            prefix = to_sink_end + (G - tail_len % G if not to_sink_end else G)
            k = np.full((H, prefix + G + n % G, D), 60000.0, np.float32)
            k[:, :prefix] = make_chunk(seed, H, prefix, D, ("float32",) * 2, "contiguous", 1.0)[0]
            v = k.copy()
            exc, msg = ValueError, r"v: head \d of the tile of tokens \d+\.\.\d+ has values too large for its fp16"
        q = self.query()
        before = observe(e.cache, q)
        with pytest.raises(exc, match=msg):
            e.cache.append(k, v, num_threads=threads)
        assert_observed_same(before, observe(e.cache, q), f"rejected append ({kind})")

    # ---- truncate ---------------------------------------------------------------------------
    def legal_lengths(self, e):
        """Lengths truncate keeps as they are: inside the sink, at a quantised tile's boundary, in the tail."""
        sink_len, tiles, _ = self.layout(e)
        return sorted({*range(sink_len + 1), *(sink_len + t * self.G for t in range(1, tiles + 1)),
                       *range(sink_len + tiles * self.G, len(e) + 1)})

    def aimed(self, e, lengths, aim, x):
        """One of lengths (a sorted list), x picking it: any; one of the last three (a draft's few tokens);
        a tile's end (the sink's end included); or next to one."""
        ends = [n for n in lengths if n >= self.sink_tokens and not (n - self.sink_tokens) % self.G]
        near = sorted({n + d for n in ends for d in (-1, 1)} & set(lengths))
        pool = {"anywhere": lengths, "near the end": lengths[-3:], "a tile's end": ends or lengths,
                "next to a tile's end": near or lengths}[aim]
        return pool[x % len(pool)]

    @rule(i=IDX, x=st.integers(0, 2**16), aim=AIMS)
    def truncate_legal(self, i, x, aim):
        e = self.entry(i)
        length = self.aimed(e, self.legal_lengths(e), aim, x)
        e.cache.truncate(length)
        if length < len(e):  # truncate(len) changes nothing (a "next" full tail stays exact)
            e.k, e.v = e.k[:, :length], e.v[:, :length]
            body = length - min(length, self.sink_tokens)
            e.tiles = body // self.G  # whole tiles kept quantised, the rest in the sink and tail

    @rule(i=IDX, x=st.integers(0, 2**16), aim=AIMS, dtypes=DTYPES, threads=THREADS)
    def truncate_recipe(self, i, x, aim, dtypes, threads):
        """truncate(truncation_point(L)) then appending tokens [point, L) again gives the cache that only
        ever held L tokens (the re-appended tokens are the model's fp16 rows, in another dtype: exact)."""
        e = self.entry(i)
        length = self.aimed(e, list(range(len(e) + 1)), aim, x)
        sink_len, tiles, _ = self.layout(e)
        body = length - min(length, sink_len)
        t, j = divmod(body, self.G)
        if t < tiles and j:
            expected = length - j  # the start of the quantised tile the cut would cut
        elif self.next and body and not j and t <= tiles:
            expected = length - self.G  # "next": the start of the quantised tile it ends on
        else:
            expected = length
        point = e.cache.truncation_point(length)
        expect(point == expected, f"truncation_point({length}) = {point}, expected {expected} "
                                  f"((sink_len, tiles, tail_len) = {self.layout(e)})")
        e.cache.truncate(point)
        e.cache.append(e.k[:, point:length].astype(dtypes[0]), e.v[:, point:length].astype(dtypes[1]),
                       num_threads=threads)
        e.k, e.v = e.k[:, :length], e.v[:, :length]
        e.tiles = self.canonical_tiles(length)

    @rule(i=IDX, kind=st.sampled_from(["cut_tile", "cut_tile", "too_long", "negative", "float"]),
          x=st.integers(0, 2**16))
    def truncate_refused(self, i, kind, x):
        e = self.entry(i)
        sink_len, tiles, _ = self.layout(e)
        if kind == "cut_tile" and tiles:
            length = sink_len + (x % tiles) * self.G + 1 + x % (self.G - 1)
            exc, msg = ValueError, f"length: {length} cuts the quantised tile of tokens"
        elif kind == "too_long" or kind == "cut_tile":
            length = len(e) + 1 + x % 5
            exc, msg = ValueError, f"length: {length} is more than the cache's {len(e)} tokens"
        elif kind == "negative":
            length = -1 - x % 5
            exc, msg = ValueError, "length: must be >= 0"
        else:
            length = float(x % (len(e) + 1))
            exc, msg = TypeError, "length: expected an int"
        q = self.query()
        before = observe(e.cache, q)
        with pytest.raises(exc, match=msg):
            e.cache.truncate(length)
        if kind != "cut_tile" or not tiles:  # truncation_point refuses what truncate refuses, bar a cut
            with pytest.raises(exc, match=msg):
                e.cache.truncation_point(length)
        assert_observed_same(before, observe(e.cache, q), f"refused truncate ({kind})")

    # ---- room ---------------------------------------------------------------------------------
    @rule(i=IDX, more=st.integers(-200, 600))
    def reserve(self, i, more):
        """Room for len + more tokens: the records buffer holds at least that many tiles after it, and
        nothing observable changes but allocated_nbytes (which never shrinks)."""
        e = self.entry(i)
        q = self.query()
        before = observe(e.cache, q)
        num_tokens = max(0, len(e) + more)
        e.cache.reserve(num_tokens)
        after = observe(e.cache, q)
        allocated = 5  # observe's index of allocated_nbytes
        expect(after[allocated] >= before[allocated], f"reserve({num_tokens}): allocated_nbytes shrank")
        room = e.cache._state[2].shape[0]
        expect(room >= (num_tokens - min(num_tokens, self.sink_tokens)) // self.G,
               f"reserve({num_tokens}): room for {room} tiles")
        before[allocated] = after[allocated]
        assert_observed_same(before, after, f"reserve({num_tokens})")

    # ---- checkpoints ------------------------------------------------------------------------
    @rule(i=IDX)
    def checkpoint(self, i):
        e = self.entry(i)
        if len(e.checkpoints) >= MAX_CHECKPOINTS:
            e.checkpoints.pop(0)
        e.checkpoints.append((e.cache.checkpoint(), e.k, e.v, e.tiles))

    # Hypothesis enables a random subset of the rules in each example (swarm testing): one that has
    # rollback but not checkpoint still rolls back, to a checkpoint its first rollback took.
    @rule(i=IDX, j=IDX)
    def rollback(self, i, j):
        """To the newest checkpoint for j = 0 (a rejected draft), older ones for larger j."""
        e = self.entry(i)
        if not e.checkpoints:
            self.checkpoint(i)
            return
        self.roll_back(e, e.checkpoints[-1 - j % len(e.checkpoints)])

    def roll_back(self, e, held):
        ck, e.k, e.v, e.tiles = held
        e.cache.rollback(ck)

    def draft_length(self, e, kind, n):
        """Tokens to append: a few (1-8), n % 8 past the next tile boundary, or n; within MAX_TOKENS."""
        if kind == "few":
            n = 1 + n % 8
        elif kind == "past a tile's end":
            sink_len, _, tail_len = self.layout(e)
            to_sink_end = self.sink_tokens - sink_len
            n = to_sink_end + (self.G - tail_len % self.G if not to_sink_end else self.G) + n % 8
        return min(n, max(0, MAX_TOKENS - len(e)))

    @rule(i=IDX, draft=st.sampled_from(DRAFTS), n=st.integers(1, 100), keep_draft=st.sampled_from([True, True, False]),
          accepted=st.sampled_from(["none"] + DRAFTS), m=st.integers(1, 100),
          back_to_draft=st.sampled_from([True, True, False]), seed=SEEDS)
    def speculate(self, i, draft, n, keep_draft, accepted, m, back_to_draft, seed):
        """A speculative decoder's step: checkpoint, append a draft (checkpointed too with keep_draft), roll
        back; then maybe append other tokens (the accepted ones), and maybe go back to the draft after all.
        The appends after the rollback must not write where the draft's checkpoint reads (tail slots past
        the restored length, records past the restored tile count): the rollback froze those buffers."""
        e = self.entry(i)
        self.checkpoint(self.pool.index(e))
        before = e.checkpoints[-1]
        self.append_tokens(e, self.draft_length(e, draft, n), seed)
        if keep_draft:
            self.checkpoint(self.pool.index(e))
            draft_state = e.checkpoints[-1]
        self.roll_back(e, before)
        if accepted != "none":
            self.append_tokens(e, self.draft_length(e, accepted, m), seed)
        if back_to_draft and keep_draft:
            self.check_entry(e, "after the accepted tokens")
            self.roll_back(e, draft_state)

    @rule(i=IDX, n=st.sampled_from([1, 1, 1, 3]), seed=SEEDS, threads=THREADS)
    def decode_step(self, i, n, seed, threads):
        """kvarn.append_attend of n tokens (one: its one-token path), against a copy given the same tokens one
        at a time with an attend after each (the same threads: the same splits, so the same bits)."""
        e = self.entry(i)
        n = min(n, MAX_TOKENS - len(e))
        if n == 0:
            return
        self.appends += 1
        k, v = make_chunk([seed, self.appends], self.H, n, self.D, ("float32", "float32"), "contiguous", self.scale)
        q = self.rng.standard_normal((n, self.query().shape[0], self.D)).astype(np.float32)
        witness = e.cache.copy()
        want = []
        for j in range(n):
            witness.append(k[:, j : j + 1], v[:, j : j + 1], num_threads=threads)
            want.append(kvarn.attend(q[j], witness, num_threads=threads))
        out = kvarn.append_attend(q, e.cache, k, v, num_threads=threads)
        expect(np.array_equal(out, np.stack(want)), f"append_attend of {n} differs from appending and attending")
        e.k = np.concatenate([e.k, k.astype(np.float16)], axis=1)
        e.v = np.concatenate([e.v, v.astype(np.float16)], axis=1)
        e.tiles = self.canonical_tiles(len(e))

    @rule(i=IDX, kind=st.sampled_from(["nan_k", "inf_v", "nan_q", "q_heads"]), seed=SEEDS)
    def refused_decode_step(self, i, kind, seed):
        """A one-token append_attend that must raise, naming the problem, and change nothing."""
        e = self.entry(i)
        k, v = make_chunk(seed, self.H, 1, self.D, ("float32", "float32"), "contiguous", 1.0)
        q = self.query()[None]
        if kind == "nan_k":
            k[0, 0, 0] = np.nan
            msg = "k: contains NaN or Inf"
        elif kind == "inf_v":
            v[-1, 0, -1] = np.inf
            msg = "v: contains NaN or Inf"
        elif kind == "nan_q":
            q[0, -1, 0] = np.nan
            msg = "q: contains NaN or Inf"
        else:
            q = np.zeros((1, 0, self.D), np.float32)
            msg = "0 query heads is not a positive multiple"
        probe = self.query()
        before = observe(e.cache, probe)
        try:
            kvarn.append_attend(q, e.cache, k, v)
        except ValueError as error:
            expect(msg in str(error), f"refused decode step ({kind}): {error}")
        else:
            raise AssertionError(f"refused decode step ({kind}): accepted")
        assert_observed_same(before, observe(e.cache, probe), f"refused decode step ({kind})")

    @rule(i=IDX)
    def audit_checkpoints(self, i):
        """Every held checkpoint still returns exactly to its content (a later write into a buffer it
        shares would show here), then back to the current state."""
        e = self.entry(i)
        now = (e.cache.checkpoint(), e.k, e.v, e.tiles)
        for held in list(e.checkpoints):
            self.roll_back(e, held)
            self.check_entry(e, f"checkpoint of {held[1].shape[1]} tokens")
        self.roll_back(e, now)

    @rule(i=IDX, j=IDX)
    def drop_checkpoint(self, i, j):
        e = self.entry(i)
        if e.checkpoints:
            e.checkpoints.pop(j % len(e.checkpoints))

    @precondition(lambda self: len(self.pool) > 1)
    @rule(i=IDX, j=IDX, x=IDX)
    def rollback_to_another_caches_checkpoint(self, i, j, x):
        src, dst = self.entry(i), self.entry(j)
        if src is dst:
            dst = self.pool[(self.pool.index(src) + 1) % len(self.pool)]
        if not src.checkpoints:
            self.checkpoint(self.pool.index(src))
        q = self.query()
        before = observe(dst.cache, q)
        with pytest.raises(ValueError, match="checkpoint: taken from another cache"):
            dst.cache.rollback(src.checkpoints[x % len(src.checkpoints)][0])
        assert_observed_same(before, observe(dst.cache, q), "rollback to a foreign checkpoint")

    # ---- copies and parts -------------------------------------------------------------------
    @rule(i=IDX, how=st.sampled_from(["copy", "copy", "copy.copy", "copy.deepcopy", "pickle"]), front=st.booleans())
    def copy_cache(self, i, how, front):
        self.copy_entry(self.entry(i), how, front)

    def copy_entry(self, e, how, front):
        c = e.cache
        new = {"copy": lambda: c.copy(), "copy.copy": lambda: copy.copy(c), "copy.deepcopy": lambda: copy.deepcopy(c),
               "pickle": lambda: pickle.loads(pickle.dumps(c))}[how]()
        assert type(new) is kvarn.KVCache and new is not c
        new = Entry(new, e.k, e.v, e.tiles)
        self.add_entry(e, new, front)
        return new

    @rule(i=IDX, how=st.sampled_from(["copy", "copy.copy", "copy.deepcopy", "pickle"]), n=st.integers(0, 70),
          m=st.integers(0, 70), seed=SEEDS, copy_first=st.booleans())
    def copy_and_diverge(self, i, how, n, m, seed, copy_first):
        """A copy, then different tokens appended to it and to the original (in either order): each
        keeps its own (a tail or records buffer they shared would take the other's)."""
        e = self.entry(i)
        new = self.copy_entry(e, how, front=False)
        for target, count in ((new, n), (e, m)) if copy_first else ((e, m), (new, n)):
            self.append_tokens(target, min(count, max(0, MAX_TOKENS - len(target))), seed)

    @rule(i=IDX, form=st.sampled_from(["as_is", "float32", "fortran"]), keep_old=st.booleans())
    def parts_round_trip(self, i, form, keep_old):
        e = self.entry(i)
        parts = e.cache.to_parts()
        assert parts["sink_tokens"] == self.sink_tokens and parts["iters"] == self.iters
        assert parts["quantize_on"] == ("next" if self.next else "fill")
        for name in ("sink_k", "sink_v", "tail_k", "tail_v"):
            if form == "float32":
                parts[name] = parts[name].astype(np.float32)  # exact: the cache stores fp16
            elif form == "fortran":
                parts[name] = np.asfortranarray(parts[name])
        new = kvarn.KVCache.from_parts(**parts)
        if keep_old:
            self.add_entry(e, Entry(new, e.k, e.v, e.tiles), front=True)
        else:  # the original is replaced (its checkpoints go with it)
            self.pool[self.pool.index(e)] = Entry(new, e.k, e.v, e.tiles)

    @precondition(lambda self: len(self.pool) > 1)
    @rule(i=IDX)
    def drop_cache(self, i):
        self.pool.pop(i % len(self.pool))

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def caches_match_their_models(self):
        for n_entry, e in enumerate(self.pool):
            self.check_entry(e, f"cache #{n_entry}")

    def check_entry(self, e, where):
        H, G, D = self.H, self.G, self.D
        R = self.preset.record_bytes(D)
        c = e.cache
        sink_len, tiles, tail_len = self.layout(e)
        expect(len(c) == len(e), f"{where}: len {len(c)}, the model has {len(e)} tokens")
        expect((c.sink_len, c.num_tiles, c.tail_len) == (sink_len, tiles, tail_len),
               f"{where}: (sink_len, num_tiles, tail_len) {(c.sink_len, c.num_tiles, c.tail_len)}, expected "
               f"{(sink_len, tiles, tail_len)} ({len(e)} tokens)")
        expect(0 <= tail_len <= (G if self.next else G - 1), f"{where}: model tail of {tail_len} tokens")
        expect(sink_len == self.sink_tokens or tiles == tail_len == 0, f"{where}: tokens past an unfilled sink")
        expect(c.nbytes == (sink_len + tail_len) * 4 * H * D + tiles * H * R, f"{where}: nbytes {c.nbytes}")
        recs = c.records
        expect(recs.dtype == np.uint8 and recs.shape == (tiles, H, R), f"{where}: records {recs.dtype} {recs.shape}")

        parts = c.to_parts()
        for name, x, lo, hi in (("sink_k", e.k, 0, sink_len), ("sink_v", e.v, 0, sink_len),
                                ("tail_k", e.k, len(e) - tail_len, len(e)),
                                ("tail_v", e.v, len(e) - tail_len, len(e))):
            got = parts[name]
            expect(got.dtype == np.float16 and got.shape == (H, hi - lo, D), f"{where}: {name} {got.dtype} {got.shape}")
            want = np.ascontiguousarray(x[:, lo:hi])
            if got.tobytes() != want.tobytes():
                raise AssertionError(f"{where}: {name} differs from the model's tokens {lo}..{hi - 1}, first at "
                                     f"(head, token, channel) {first_difference(got, want)}")
        expect(parts["records"].tobytes() == recs.tobytes(), f"{where}: to_parts()'s records are not .records")

        for t in range(tiles):
            span = slice(sink_len + t * G, sink_len + (t + 1) * G)
            want = reference_records(np.ascontiguousarray(e.k[:, span]), np.ascontiguousarray(e.v[:, span]),
                                     self.preset, self.iters)
            if recs[t].tobytes() != want.tobytes():
                diff = np.flatnonzero(recs[t].reshape(-1) != want.reshape(-1))
                raise AssertionError(f"{where}: tile {t} (tokens {span.start}..{span.stop - 1}) differs from "
                                     f"quantize_tile of its tokens in {diff.size} bytes, first at {diff[:5]}")

        for ck, k_then, _, _ in e.checkpoints:
            expect(len(ck) == k_then.shape[1], f"{where}: a checkpoint of {k_then.shape[1]} tokens has len {len(ck)}")

        if len(e):
            q = self.query()
            # the records decoded by the oracle, sink and tail from the model (checked equal to the cache's above)
            k_hat, v_hat = oracle.dequantize_cache(c, e.k, e.v, decode=decoded_record)
            # Scores of O(10), as a model's: float32 scores of |s| ~ 1e3 (keys x 30 with outlier channels)
            # are off by ~1e-4 relative in exp(s) whatever the kernel, which no tolerance of 1e-5 allows.
            scores = np.einsum("hgd,htd->hgt", q.reshape(H, -1, D).astype(np.float64), k_hat) / np.sqrt(D)
            s_max = np.abs(scores).max()
            if s_max > 10:
                q = (q * (10 / s_max)).astype(np.float32)
            ref, value_norm = oracle.attention_with_value_norm(q, k_hat, v_hat, 1 / np.sqrt(D))
            # The exact float scores, then the integer mode drawn (scalar kernels run float only; a CPU or
            # build without AVX2, e.g. aarch64, refuses the integer modes).
            for mode in ("float", self.int_mode):
                if mode != "float" and "avx2" not in kvarn.available_isas():
                    continue
                kvarn.set_score_mode(mode)
                try:
                    ran = kvarn.score_mode()
                    if mode != "float" and ran == "float":
                        continue
                    err = np.linalg.norm(kvarn.attend(q, c) - ref) / value_norm
                finally:
                    kvarn.set_score_mode(self.saved_isa_mode[1])
                expect(err <= MODE_RTOL[ran], f"{where}: attend error {err:.2e} of the values' norm > "
                                              f"{MODE_RTOL[ran]:g} ({self.isa}, {ran} scores)")


TestKVCacheStateful = KVCacheMachine.TestCase
# No explain phase: it replays a failure under line tracing (minutes here) to list lines it alone ran,
# numpy's array printing for this machine.
TestKVCacheStateful.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                        phases=[phase for phase in Phase if phase != Phase.explain],
                                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
