"""Multi-token decode steps (kvarn.append_attend, append_attend_batch, append_attend_fp16_batch): the
same records and, bit for bit, the same outputs as appending one token at a time and attending after
each; each token within float64 attention over the cache as it stood after that token; refused input
appends nothing."""
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvarn
import oracle
from conftest import kv_like
from kvarn import _native, _ops

# (Hq, Hk, D): SmolLM2's grouping, the headline's at two kv heads, one query head per kv head, head_dim 48
SHAPES = [(9, 3, 64), (8, 2, 128), (4, 4, 16), (6, 2, 48)]
# (tokens before the step, tokens in the step, sink_tokens): a step inside the sink, one from the sink
# into the tail, inside one tile, ending on a tile's completion, one crossing two tiles, one longer than
# a tile that starts an empty cache with a 5-token sink, one without a sink
STEPS = [(0, 5, 128), (100, 60, 128), (250, 7, 128), (376, 8, 128), (300, 200, 128), (0, 300, 5), (130, 140, 0)]


def tokens(rng, Hk, n, D):
    return kv_like(rng, (Hk, n, D)).astype(np.float16), rng.standard_normal((Hk, n, D)).astype(np.float16)


def one_at_a_time(q, cache, k, v, **kw):
    """The reference: append, attend, token by token."""
    out = []
    for i in range(q.shape[0]):
        cache.append(k[:, i : i + 1], v[:, i : i + 1])
        out.append(kvarn.attend(q[i], cache, **kw))
    return np.stack(out)


def batch_one_at_a_time(q, caches, k, v, attend_batch):
    """The batch reference: each row's next token appended, then one attend_batch call, token by token."""
    out = []
    for i in range(q.shape[1]):
        for c, kk, vv in zip(caches, k, v):
            c.append(kk[:, i : i + 1], vv[:, i : i + 1])
        out.append(attend_batch(q[:, i], caches))
    return np.stack(out, axis=1)


def assert_same_content(a, b):
    assert len(a) == len(b)
    pa, pb = a.to_parts(), b.to_parts()
    for key in pa:
        assert np.array_equal(pa[key], pb[key]), key


def pair(Hk, D, start, k0, v0, **kw):
    """Two caches holding the same first `start` tokens."""
    caches = [kvarn.KVCache(Hk, D, **kw) for _ in range(2)]
    for c in caches:
        if start:
            c.append(k0[:, :start], v0[:, :start])
    return caches


@pytest.mark.parametrize("mode", ["float", "int16", "int8"])
@pytest.mark.parametrize("quantize_on", ["fill", "next"])
@pytest.mark.parametrize("Hq, Hk, D", SHAPES)
def test_matches_one_token_at_a_time_bit_for_bit(isa, mode, quantize_on, Hq, Hk, D, rng):
    _native.set_score_mode(mode)  # int8 where this ISA lacks it: whatever it runs instead, on both sides
    for start, n, sink in STEPS:
        k, v = tokens(rng, Hk, start + n, D)
        q = rng.standard_normal((n, Hq, D)).astype(np.float32)
        ref_cache, cache = pair(Hk, D, start, k, v, sink_tokens=sink, quantize_on=quantize_on)
        ref = one_at_a_time(q, ref_cache, k[:, start:], v[:, start:], num_threads=2)
        out = kvarn.append_attend(q, cache, k[:, start:], v[:, start:], num_threads=2)
        assert out.shape == (n, Hq, D) and out.dtype == np.float32
        assert np.array_equal(out, ref), (start, n, sink, float(np.abs(out - ref).max()))
        assert_same_content(cache, ref_cache)


@given(start=st.integers(0, 600), n=st.integers(1, 280), sink=st.sampled_from([0, 1, 7, 128]),
       quantize_on=st.sampled_from(["fill", "next"]), group_heads=st.integers(1, 6), threads=st.integers(1, 4),
       preset=st.sampled_from(["k4v2_g128", "k4v4_g64", "k2v2_g128"]), seed=st.integers(0, 2**32 - 1))
def test_any_step_matches_one_token_at_a_time(start, n, sink, quantize_on, group_heads, threads, preset, seed):
    rng = np.random.default_rng(seed)
    Hk, D = 2, 32
    k, v = tokens(rng, Hk, start + n, D)
    q = rng.standard_normal((n, Hk * group_heads, D)).astype(np.float32)
    ref_cache, cache = pair(Hk, D, start, k, v, sink_tokens=sink, quantize_on=quantize_on, preset=preset)
    ref = one_at_a_time(q, ref_cache, k[:, start:], v[:, start:], num_threads=threads)
    out = kvarn.append_attend(q, cache, k[:, start:], v[:, start:], num_threads=threads)
    assert np.array_equal(out, ref)
    assert_same_content(cache, ref_cache)


@pytest.mark.parametrize("start, n", [(0, 20), (120, 150), (1000, 9)])
def test_each_token_within_float64_attention_over_its_prefix(isa, start, n, rng):
    """Token i's output against float64 attention over the cache after token i, decoded by the oracle
    (a second cache, appended to token by token, gives each moment's records)."""
    Hq, Hk, D = 8, 2, 64
    k, v = tokens(rng, Hk, start + n, D)
    q = rng.standard_normal((n, Hq, D)).astype(np.float32)
    witness, cache = pair(Hk, D, start, k, v)
    out = kvarn.append_attend(q, cache, k[:, start:], v[:, start:])
    for i in range(n):
        witness.append(k[:, start + i : start + i + 1], v[:, start + i : start + i + 1])
        k_hat, v_hat = oracle.dequantize_cache(witness, k[:, : start + i + 1], v[:, : start + i + 1])
        ref = oracle.attention(q[i], k_hat, v_hat, 1 / np.sqrt(D))
        err = np.linalg.norm(out[i] - ref) / np.linalg.norm(ref)
        assert err <= 1e-5, (i, err)


def test_batch_matches_attend_batch_token_by_token(rng):
    """Rows of different lengths complete tiles at different tokens of the step: the chunks break wherever
    any row's does, and every row gets what attend_batch after each token gives."""
    Hq, Hk, D, n = 9, 3, 64, 40
    starts = [0, 100, 255, 1000]
    data = [tokens(rng, Hk, s + n, D) for s in starts]
    ref_caches, caches = [], []
    for s, (k, v) in zip(starts, data):
        a, b = pair(Hk, D, s, k, v)
        ref_caches.append(a)
        caches.append(b)
    q = rng.standard_normal((len(starts), n, Hq, D)).astype(np.float32)
    new_k = np.stack([k[:, s:] for s, (k, _) in zip(starts, data)])
    new_v = np.stack([v[:, s:] for s, (_, v) in zip(starts, data)])
    ref = batch_one_at_a_time(q, ref_caches, new_k, new_v, kvarn.attend_batch)
    out = kvarn.append_attend_batch(q, caches, new_k, new_v)
    assert np.array_equal(out, ref)
    for a, b in zip(caches, ref_caches):
        assert_same_content(a, b)


def test_fp16_caches_match_one_token_at_a_time_and_float64(rng):
    Hq, Hk, D, n = 9, 3, 64, 33
    starts = [0, 500]
    caches = [kvarn.FP16Cache(Hk, D) for _ in starts]
    ref_caches = [kvarn.FP16Cache(Hk, D) for _ in starts]
    data = [tokens(rng, Hk, s + n, D) for s in starts]
    for s, (k, v), a, b in zip(starts, data, caches, ref_caches):
        if s:
            a.append(k[:, :s], v[:, :s])
            b.append(k[:, :s], v[:, :s])
    q = rng.standard_normal((len(starts), n, Hq, D)).astype(np.float32)
    new_k = [k[:, s:] for s, (k, _) in zip(starts, data)]
    new_v = [v[:, s:] for s, (_, v) in zip(starts, data)]
    ref = batch_one_at_a_time(q, ref_caches, new_k, new_v, kvarn.attend_fp16_batch)
    out = kvarn.append_attend_fp16_batch(q, caches, new_k, new_v)
    assert np.array_equal(out, ref)
    for b, (s, (k, v)) in enumerate(zip(starts, data)):
        for i in (0, n // 2, n - 1):
            kk, vv = (x[:, : s + i + 1].astype(np.float64) for x in (k, v))
            ref64 = oracle.attention(q[b, i], kk, vv, 1 / np.sqrt(D))
            assert np.linalg.norm(out[b, i] - ref64) / np.linalg.norm(ref64) <= 1e-5


def test_zero_tokens_return_nothing_and_append_nothing(rng):
    k, v = tokens(rng, 2, 300, 32)
    cache = kvarn.KVCache(2, 32)
    cache.append(k, v)
    before = cache.checkpoint()
    out = kvarn.append_attend(np.zeros((0, 4, 32), np.float32), cache, k[:, :0], v[:, :0])
    assert out.shape == (0, 4, 32)
    assert len(cache) == len(before) == 300


def _filled(rng, Hk=2, D=32, n=250):
    k, v = tokens(rng, Hk, n, D)
    cache = kvarn.KVCache(Hk, D)
    cache.append(k, v)
    return cache, cache.to_parts()


def _bad_steps(rng, Hk=2, D=32, n=140):
    """(what, q, k, v, the error's words): each refused; n = 140 crosses a tile's completion at 250 tokens,
    so where the bad token sits late, chunks before it have been appended and attended."""
    k, v = tokens(rng, Hk, n, D)
    q = rng.standard_normal((n, 2 * Hk, D)).astype(np.float32)
    late_nan_k = k.copy()
    late_nan_k[1, 130, 3] = np.nan
    late_inf_v = v.copy()
    late_inf_v[0, 139, 0] = np.inf
    nan_q = q.copy()
    nan_q[100, 1, 5] = np.nan
    return [
        ("a NaN in k after a tile completed", q, late_nan_k, v, "k"),
        ("an Inf in v, the last token", q, k, late_inf_v, "v"),
        ("a NaN in q", nan_q, k, v, "q"),
        ("q beyond the overflow bound", q * 1e33, k, v, "q"),
        ("q with 3 heads for 2 kv heads", q[:, :3], k, v, "q"),
        ("q of the wrong head_dim", q[..., :16], k, v, "head_dim"),
        ("q as [Hq, D]", q[0], k, v, "q"),
        ("k with a token fewer than q", q, k[:, :-1], v[:, :-1], "k, v"),
        ("v shaped unlike k", q, k, v[:, :, :16], "k, v"),
        ("k with 3 kv heads", q, np.concatenate([k, k[:1]]), np.concatenate([v, v[:1]]), "k, v"),
    ]


def test_refused_steps_append_nothing(rng):
    cache, parts = _filled(rng)
    for what, q, k, v, words in _bad_steps(rng):
        with pytest.raises(ValueError, match=words):
            kvarn.append_attend(q, cache, k, v)
        after = cache.to_parts()
        assert len(cache) == 250, what
        for key in parts:
            assert np.array_equal(parts[key], after[key]), (what, key)
    # and the cache still takes a good step, as a fresh copy of it does token by token
    k, v = tokens(rng, 2, 140, 32)
    q = rng.standard_normal((140, 4, 32)).astype(np.float32)
    ref_cache = kvarn.KVCache.from_parts(**parts)
    assert np.array_equal(kvarn.append_attend(q, cache, k, v), one_at_a_time(q, ref_cache, k, v))


def test_a_refused_row_rolls_back_every_row(rng):
    caches = [_filled(rng, n=n)[0] for n in (250, 10)]
    parts = [c.to_parts() for c in caches]
    k, v = tokens(rng, 2, 140, 32)
    k2 = k.copy()
    k2[0, 120, 0] = np.nan  # row 1's token 120: row 0 completed a tile at its token 5 before it
    q = rng.standard_normal((2, 140, 4, 32)).astype(np.float32)
    with pytest.raises(ValueError, match=r"sequence 1 \(caches\[1\]\): k"):
        kvarn.append_attend_batch(q, caches, [k, k2], [v, v])
    for c, p, n in zip(caches, parts, (250, 10)):
        assert len(c) == n
        for key, value in c.to_parts().items():
            assert np.array_equal(p[key], value), key
    with pytest.raises(ValueError, match="batch of 1"):
        kvarn.append_attend_batch(q[:1], caches, [k, k], [v, v])
    with pytest.raises(ValueError, match="2 and 1 sequences"):
        kvarn.append_attend_batch(q, caches, [k, k], [v])
    with pytest.raises(TypeError, match="v: expected the sequences' tokens"):
        kvarn.append_attend_batch(q, caches, [k, k], 3.0)
    with pytest.raises(TypeError, match=r"caches\[1\]"):
        kvarn.append_attend_batch(q, [caches[0], kvarn.FP16Cache(2, 32)], [k, k], [v, v])
    with pytest.raises(ValueError, match=r"caches\[1\]: 1 kv heads"):
        kvarn.append_attend_batch(q, [caches[0], kvarn.KVCache(1, 32)], [k, k], [v, v])
    with pytest.raises(TypeError, match="cache: expected a kvarn.KVCache"):
        kvarn.append_attend(q[0], caches, k, v)


def test_refused_fp16_step_keeps_the_caches(rng):
    """Row 1's bad token is found after row 0's tokens went in (past row 0's first 256-token buffer, which
    grew): row 0 is undone too, and both keep their tokens."""
    caches = [kvarn.FP16Cache(2, 32), kvarn.FP16Cache(2, 32)]
    k, v = tokens(rng, 2, 300, 32)
    for c in caches:
        c.append(k[:, :200], v[:, :200])
    bad_v = v[:, 200:].copy()
    bad_v[1, 99, 0] = np.nan
    q = rng.standard_normal((2, 100, 4, 32)).astype(np.float32)
    with pytest.raises(ValueError, match=r"sequence 1 \(caches\[1\]\): v"):
        kvarn.append_attend_fp16_batch(q, caches, [k[:, 200:]] * 2, [v[:, 200:], bad_v])
    for c in caches:
        assert len(c) == 200
        assert np.array_equal(c.keys_values()[0], k[:, :200]) and np.array_equal(c.keys_values()[1], v[:, :200])
    # and they still take a step: the same as token by token
    ref = [kvarn.FP16Cache(2, 32) for _ in caches]
    for c in ref:
        c.append(k[:, :200], v[:, :200])
    want = batch_one_at_a_time(q, ref, [k[:, 200:]] * 2, [v[:, 200:]] * 2, kvarn.attend_fp16_batch)
    assert np.array_equal(kvarn.append_attend_fp16_batch(q, caches, [k[:, 200:]] * 2, [v[:, 200:]] * 2), want)


def test_native_call_refuses_hidden_tokens_outside_full_precision(rng):
    """kvarn_attend_tokens attends token i without the last n_tokens - 1 - i tokens: they must lie in the
    tail (or the sink while there are no tiles), and the sequence must hold n_tokens tokens."""
    cache, _ = _filled(rng, n=256 + 3)  # sink 128, one tile, 3 tail tokens
    view = _ops.native_view(cache)
    scale = 1 / np.sqrt(32)

    def call(n_tokens, view=view):
        q = rng.standard_normal((1, n_tokens * 4, 32)).astype(np.float32)
        return _native.attend([view], q, scale, np.empty_like(q), 1, n_tokens)

    assert call(4) == _native.OK  # the 3 hidden tokens are the tail
    assert call(5) == _native.ERR_ARGUMENT  # the 4th would be the tile's last
    sink_only, _ = _filled(rng, n=100)
    assert call(100, _ops.native_view(sink_only)) == _native.OK  # no tiles: the sink's tokens may be hidden
    assert call(101, _ops.native_view(sink_only)) == _native.ERR_ARGUMENT  # more tokens than the sequence
    with pytest.raises(ValueError, match="n_tokens"):
        call_q = rng.standard_normal((1, 6, 32)).astype(np.float32)
        _native.attend([view], call_q, scale, np.empty_like(call_q), 1, 4)  # 6 rows are not 4 tokens' heads
    with pytest.raises(ValueError, match="n_tokens"):
        call(0)


def _writer_between_chunks(monkeypatch, cache, marker, fail_on_call=None):
    """Makes the step's first native call start another thread appending `marker` to the cache and give it
    0.2 s to do so before the step goes on (and the fail_on_call-th call raise): a step that let writers in
    between its chunks would take that token inside the step."""
    real, calls, threads = _ops.run_attend, [], []

    def run_attend(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            t = threading.Thread(target=cache.append, args=(marker, marker))
            t.start()
            t.join(0.2)
            threads.append(t)
        if len(calls) == fail_on_call:
            raise ValueError("q: refused by the test")
        return real(*args, **kwargs)

    monkeypatch.setattr(_ops, "run_attend", run_attend)
    return threads


def test_another_threads_append_waits_for_a_step(monkeypatch, rng):
    """A step of several chunks (tile completions inside it) holds the cache's append lock: another thread's
    append lands after all of its tokens, as if the step were one append."""
    Hk, D, n = 2, 32, 300
    k, v = tokens(rng, Hk, 200 + n, D)
    marker = np.full((Hk, 1, D), 0.5, np.float16)
    q = rng.standard_normal((n, 4, D)).astype(np.float32)
    ref_cache, cache = pair(Hk, D, 200, k, v)
    ref = one_at_a_time(q, ref_cache, k[:, 200:], v[:, 200:])
    ref_cache.append(marker, marker)
    threads = _writer_between_chunks(monkeypatch, cache, marker)
    out = kvarn.append_attend(q, cache, k[:, 200:], v[:, 200:])
    threads[0].join()
    assert np.array_equal(out, ref)
    assert_same_content(cache, ref_cache)


def test_an_undone_step_keeps_another_threads_append(monkeypatch, rng):
    """A step refused after its first chunk is undone under the lock: an append another thread made meanwhile
    (it waited) is kept, not rolled back with the step's tokens."""
    Hk, D, n = 2, 32, 300
    k, v = tokens(rng, Hk, 200 + n, D)
    marker = np.full((Hk, 1, D), 0.5, np.float16)
    q = rng.standard_normal((n, 4, D)).astype(np.float32)
    ref_cache, cache = pair(Hk, D, 200, k, v)
    ref_cache.append(marker, marker)
    threads = _writer_between_chunks(monkeypatch, cache, marker, fail_on_call=2)
    with pytest.raises(ValueError, match="refused by the test"):
        kvarn.append_attend(q, cache, k[:, 200:], v[:, 200:])
    threads[0].join()
    assert_same_content(cache, ref_cache)


def test_the_same_cache_twice_in_a_step_is_refused(rng):
    cache, parts = _filled(rng)
    k, v = tokens(rng, 2, 3, 32)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="appears twice"):
        kvarn.append_attend_batch(q, [cache, cache], [k, k], [v, v])
    assert len(cache) == 250


def _general_path_forbidden(monkeypatch):
    """Makes the general path (append_attend_chunks) fail, so a test sees the one-token path do the work."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a one-token step took the general path")
    monkeypatch.setattr(_ops, "append_attend_chunks", forbidden)


@pytest.mark.parametrize("quantize_on", ["fill", "next"])
def test_one_token_steps_match_append_then_attend(isa, quantize_on, rng, monkeypatch):
    """append_attend's one-token case has its own path (_ops._append_attend_one_cache): token by token through
    the sink, the tail, the token that completes a tile and those after it, with float16 / float32 /
    float64 inputs and one or two threads, bit for bit what append then attend give, the same records."""
    _general_path_forbidden(monkeypatch)
    Hq, Hk, D, n = 9, 3, 64, 270
    k, v = tokens(rng, Hk, n, D)
    q = rng.standard_normal((n, Hq, D)).astype(np.float32)
    ref_cache, cache = pair(Hk, D, 0, k, v, quantize_on=quantize_on)
    for i in range(n):
        dtype = (np.float16, np.float32, np.float64)[i % 3]
        qi, ki, vi = q[i : i + 1].astype(dtype), k[:, i : i + 1].astype(dtype), v[:, i : i + 1].astype(dtype)
        ref = one_at_a_time(qi, ref_cache, ki, vi, num_threads=1 + i % 2)
        out = kvarn.append_attend(qi, cache, ki, vi, num_threads=1 + i % 2)
        assert out.shape == (1, Hq, D) and out.dtype == np.float32
        assert np.array_equal(out, ref), i
    assert_same_content(cache, ref_cache)
    assert cache.num_tiles == 1 and cache.tail_len == 14  # "next" quantised the full tail on token 257


def test_refused_one_token_steps_keep_the_cache(rng, monkeypatch):
    """One-token steps refused before the append (q), by it (k, v) and after it, by the native call (scores
    over spiky keys that overflow float32, as in test_cache's spiky test), here on the token that completes a
    tile: the cache as it was every time, and then it takes a good step as a copy of it does."""
    _general_path_forbidden(monkeypatch)
    k = np.ones((1, 256, 16), np.float32)
    spikes = rng.random(k.shape) < 0.02
    k[spikes] = 65504 * np.sign(rng.standard_normal(spikes.sum()))
    cache = kvarn.KVCache(1, 16, sink_tokens=0)
    cache.append(k[:, :255], np.ones_like(k[:, :255]))
    parts = cache.to_parts()
    keys = cache.dequantize()[0][0][:128]
    q_limit = np.finfo(np.float32).max / (16 * 2**17)  # check_queries' bound on max |q * scale|
    q_over = (np.sign(keys[int(np.linalg.norm(keys, axis=-1).argmax())]) * q_limit * 0.9).astype(np.float32)[None, None]
    token, one = k[:, 255:], np.ones((1, 1, 16), np.float32)
    bad = [
        ("a NaN in q", np.full((1, 1, 16), np.nan, np.float32), token, one, "^q: contains NaN"),
        ("q beyond the overflow bound", np.full((1, 1, 16), 1e37, np.float32), token, one, "^q: max"),
        ("a NaN in k", np.ones((1, 1, 16), np.float32), np.full((1, 1, 16), np.nan, np.float32), one, "^k: contains"),
        ("v beyond fp16", np.ones((1, 1, 16), np.float32), token, one * 1e6, "^v: values beyond"),
        ("scores that overflow after the append", q_over, token, one, "^q: the attention scores or outputs overflowed"),
    ]
    for what, q, kk, vv, words in bad:
        with pytest.raises(ValueError, match=words):
            kvarn.append_attend(q, cache, kk, vv, scale=1.0)
        assert len(cache) == 255 and cache.num_tiles == 1, what
        after = cache.to_parts()
        for key in parts:
            assert np.array_equal(parts[key], after[key]), (what, key)
    # the batch form for one sequence takes the same path, and names the cache as the general path does
    with pytest.raises(ValueError, match=r"overflowed float32 for these queries and caches\[0\]; "):
        kvarn.append_attend_batch(q_over[None], [cache], token[None], one[None], scale=1.0)
    assert all(np.array_equal(parts[key], value) for key, value in cache.to_parts().items())
    ref_cache = kvarn.KVCache.from_parts(**parts)
    q = np.ones((1, 1, 16), np.float32)
    assert np.array_equal(kvarn.append_attend(q, cache, token, one), one_at_a_time(q, ref_cache, token, one))
    assert cache.num_tiles == 2
    assert_same_content(cache, ref_cache)


@pytest.mark.parametrize("kind", ["kvarn", "fp16"])
def test_one_sequence_one_token_batch_steps_match(kind, rng, monkeypatch):
    """append_attend_batch / append_attend_fp16_batch with one sequence and one token take the one-token path
    too (stacked or listed k, v): bit for bit the appends and the batch attend, the same records; a refused token
    leaves the cache as it was, with the general path's message."""
    _general_path_forbidden(monkeypatch)
    Hq, Hk, D, n = 4, 2, 32, 140
    k, v = tokens(rng, Hk, n, D)
    q = rng.standard_normal((n, Hq, D)).astype(np.float32)
    make, step, attend = ((kvarn.KVCache, kvarn.append_attend_batch, kvarn.attend_batch) if kind == "kvarn" else
                          (kvarn.FP16Cache, kvarn.append_attend_fp16_batch, kvarn.attend_fp16_batch))
    cache, ref_cache = make(Hk, D), make(Hk, D)
    for i in range(n):
        ki, vi = k[:, i : i + 1], v[:, i : i + 1]
        rows = (ki[None], vi[None]) if i % 2 else ([ki], [vi])
        out = step(q[None, i : i + 1], [cache], *rows)
        ref_cache.append(ki, vi)
        assert out.shape == (1, 1, Hq, D) and np.array_equal(out[0, 0], attend(q[None, i], [ref_cache])[0]), i
    bad = k[:, :1].copy()
    bad[1, 0, 3] = np.nan
    with pytest.raises(ValueError, match="^k: contains NaN"):
        step(q[None, :1], [cache], bad[None], v[None, :, :1])
    assert len(cache) == n
    if kind == "kvarn":
        assert_same_content(cache, ref_cache)
    else:  # the first n tokens as appended (views: the refused token could only have gone past them)
        assert all(np.array_equal(a, b) for a, b in zip(cache.keys_values(), (k, v)))


def test_rows_as_nested_lists_take_any_step(rng):
    """k and v rows that are not arrays (nested lists, as append takes them) go through steps of one chunk and of
    several (crossing a tile), as arrays do; a ragged row is refused by name, appending nothing."""
    k, v = tokens(rng, 2, 270, 32)
    q = rng.standard_normal((1, 20, 4, 32)).astype(np.float32)
    for start, n in ((100, 3), (240, 20)):  # inside a tile; across the tile that completes at 256
        ref_cache, cache = pair(2, 32, start, k, v)
        new_k, new_v = k[:, start : start + n], v[:, start : start + n]
        want = kvarn.append_attend_batch(q[:, :n], [ref_cache], new_k[None], new_v[None])
        out = kvarn.append_attend_batch(q[:, :n], [cache], [new_k.tolist()], [new_v.tolist()])
        assert np.array_equal(out, want), (start, n)
        assert_same_content(cache, ref_cache)
    ragged = [[[0.0] * 32, [0.0] * 31]] * 2
    with pytest.raises(TypeError, match="^k: cannot be read as a numpy array"):
        kvarn.append_attend_batch(q[:, :2], [cache], [ragged], [new_v[:, :2].tolist()])
    assert_same_content(cache, ref_cache)


def test_one_cache_steps_of_several_tokens_skip_the_batch_bookkeeping(rng, monkeypatch):
    """Steps of several tokens on one cache (append_attend, and the batch forms given one sequence) take the
    one-cache path too: the general path's shape check is made to fail, and each step still equals token by token,
    also across a tile's completion; a bad token after a tile completed inside the step rolls it back."""
    def forbidden(*args):
        raise AssertionError("a one-cache step took the general path")
    monkeypatch.setattr(_ops, "_shaped", forbidden)
    Hq, Hk, D = 4, 2, 32
    k, v = tokens(rng, Hk, 400, D)
    q = rng.standard_normal((400, Hq, D)).astype(np.float32)
    ref_cache, cache = pair(Hk, D, 0, k, v)
    pos = 0
    for i, n in enumerate([5, 120, 7, 130, 3]):  # the first tile (tokens 128-255) completes inside the fourth step
        ks, vs, qs = k[:, pos : pos + n], v[:, pos : pos + n], q[pos : pos + n]
        want = one_at_a_time(qs, ref_cache, ks, vs)
        if i % 2:
            out = kvarn.append_attend(qs, cache, ks, vs)
        else:
            out = kvarn.append_attend_batch(qs[None], [cache], ks[None], vs[None])[0]
        assert np.array_equal(out, want), i
        pos += n
    assert_same_content(cache, ref_cache)
    bad = k[:, pos : pos + 125].copy()  # 265 + 125: the tile ending at token 384 completes before the bad token
    bad[0, 124, 0] = np.nan
    with pytest.raises(ValueError, match="^k: contains NaN"):
        kvarn.append_attend(q[pos : pos + 125], cache, bad, v[:, pos : pos + 125])
    assert_same_content(cache, ref_cache)


@pytest.mark.parametrize("kind", ["kvarn", "fp16"])
def test_one_token_batch_steps_write_straight_into_the_output(kind, rng, monkeypatch):
    """Batch one-token steps of several sequences (a model's decode step) have the native call write the step's
    output itself (no second array and copy): bit for bit B appends and the batch attend, through the sink, a tile
    completion and the tail, rows of different lengths."""
    real, given = _ops.run_attend, []

    def run_attend(*args, **kwargs):
        given.append(kwargs.get("out"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_ops, "run_attend", run_attend)
    Hq, Hk, D, n = 6, 2, 48, 140
    starts = [0, 5, 120]
    data = [tokens(rng, Hk, s + n, D) for s in starts]
    make, step, attend = ((kvarn.KVCache, kvarn.append_attend_batch, kvarn.attend_batch) if kind == "kvarn" else
                          (kvarn.FP16Cache, kvarn.append_attend_fp16_batch, kvarn.attend_fp16_batch))
    caches, ref_caches = [], []
    for s, (k, v) in zip(starts, data):
        for group in (caches, ref_caches):
            group.append(make(Hk, D))
            if s:
                group[-1].append(k[:, :s], v[:, :s])
    q = rng.standard_normal((len(starts), n, Hq, D)).astype(np.float32)
    for i in range(n):
        new_k = np.stack([k[:, s + i : s + i + 1] for s, (k, _) in zip(starts, data)])
        new_v = np.stack([v[:, s + i : s + i + 1] for s, (_, v) in zip(starts, data)])
        given.clear()
        out = step(q[:, i : i + 1], caches, new_k, new_v)
        assert len(given) == 1 and given[0] is not None and np.shares_memory(given[0], out), i
        for c, kk, vv in zip(ref_caches, new_k, new_v):
            c.append(kk, vv)
        assert np.array_equal(out[:, 0], attend(q[:, i], ref_caches)), i
    if kind == "kvarn":
        for a, b in zip(caches, ref_caches):
            assert_same_content(a, b)


def test_run_attend_writes_a_given_output_or_returns_its_own(rng):
    """run_attend's out: a C-contiguous float32 array of the queries' shape is written and returned; anything
    else (another dtype or shape, a strided view) is left untouched and a new array returned, equal."""
    Hq, Hk, D = 4, 2, 32
    k, v = tokens(rng, Hk, 300, D)
    cache = kvarn.KVCache(Hk, D)
    cache.append(k, v)
    q = rng.standard_normal((1, Hq, D)).astype(np.float32)
    want = _ops.run_attend(q, [cache], 0.25, 1)
    out = np.full((1, Hq, D), np.nan, np.float32)
    assert _ops.run_attend(q, [cache], 0.25, 1, out=out) is out and np.array_equal(out, want)
    for unfit in (np.zeros((1, Hq, D), np.float64), np.zeros((1, Hq + 1, D), np.float32),
                  np.zeros((1, Hq, 2 * D), np.float32)[:, :, ::2]):
        before = unfit.copy()
        got = _ops.run_attend(q, [cache], 0.25, 1, out=unfit)
        assert got is not unfit and np.array_equal(got, want) and np.array_equal(unfit, before)
