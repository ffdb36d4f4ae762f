"""Pickling and copying of KVCache, FP16Cache and KVCache checkpoints."""
import copy
import pickle
import sys
import threading
import time

import numpy as np
import pytest

import kvarn
from kvarn.fp16cache import FP16Cache

H, D = 2, 64
PROTOCOLS = sorted({2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL})


def tokens(rng, n):
    k = rng.standard_normal((H, n, D)).astype(np.float32)
    v = rng.standard_normal((H, n, D)).astype(np.float32)
    return k, v


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_cache(a, b, q):
    """Same type, settings, content (byte for byte) and attention output (bit for bit)."""
    assert type(a) is type(b)
    for name in ("num_kv_heads", "head_dim", "preset", "sink_tokens", "iters", "quantize_on"):
        assert getattr(a, name) == getattr(b, name), name
    pa, pb = a.to_parts(), b.to_parts()
    assert pa.keys() == pb.keys()
    for name in pa:
        if isinstance(pa[name], np.ndarray):
            assert same_bytes(pa[name], pb[name]), name
        else:
            assert pa[name] == pb[name], name
    assert same_bytes(a.records, b.records)
    assert (len(a), a.sink_len, a.num_tiles, a.tail_len) == (len(b), b.sink_len, b.num_tiles, b.tail_len)
    if len(a):
        assert same_bytes(a.attend(q), b.attend(q))


def rolled_back(rng, preset, sink, n, **kw):
    """A cache rolled back to a checkpoint, with frozen buffers that later appends must copy first."""
    cache = kvarn.KVCache(H, D, preset, sink, **kw)
    cache.append(*tokens(rng, n))
    ck = cache.checkpoint()
    cache.append(*tokens(rng, 300))
    cache.rollback(ck)
    return cache


# (preset, sink_tokens, tokens appended, KVCache keyword arguments), each a different layout.
LAYOUTS = {
    "empty": ("k4v2_g128", None, 0, {}),
    "sink only": ("k4v2_g128", None, 50, {}),
    "sink full": ("k4v4_g64", None, 64, {}),
    "sink and tiles": ("k4v2_g64", 16, 16 + 3 * 64, {}),
    "sink, tiles and tail": ("k2v2_g128", None, 128 + 2 * 128 + 37, {}),
    "no sink, tail only": ("k8v8_g128", 0, 100, {}),
    "iters=3": ("k4v2_g64", 8, 8 + 64 + 10, {"iters": 3}),
    "quantize_on=next, full tail": ("k4v2_g64", 0, 2 * 64, {"quantize_on": "next"}),
    "quantize_on=next, tail": ("k4v4_g128", 4, 4 + 128 + 5, {"quantize_on": "next"}),
    "custom preset": (kvarn.Preset("mine", 4, 4, 64), 3, 3 + 64 + 1, {}),
    "after rollback": ("k4v2_g64", 0, 64 + 7, {}),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pickle_round_trip_then_same_appends(layout, rng):
    preset, sink, n, kw = LAYOUTS[layout]
    if layout == "after rollback":
        cache = rolled_back(rng, preset, sink, n, **kw)
    else:
        cache = kvarn.KVCache(H, D, preset, sink, **kw)
        if n:
            cache.append(*tokens(rng, n))
    q = rng.standard_normal((4, D)).astype(np.float32)
    for protocol in PROTOCOLS:
        twin = pickle.loads(pickle.dumps(cache, protocol))
        assert_same_cache(cache, twin, q)
    # Appends to both: a token, a run completing tiles, another token; identical records throughout.
    a, b = cache.copy(), twin
    for m in (1, 150, 1, 64):
        k, v = tokens(rng, m)
        a.append(k, v)
        b.append(k, v)
        assert_same_cache(a, b, q)
    assert_same_cache(cache, pickle.loads(pickle.dumps(cache)), q)  # the original is unchanged by all this


# Module level, where pickle finds them by name.
class NamedSubclass(kvarn.KVCache):
    pass


class NamedFP16Subclass(FP16Cache):
    pass


def test_pickle_keeps_the_subclass_and_its_attributes(rng):
    cache = NamedSubclass(H, D, "k4v4_g64", sink_tokens=5, iters=4)
    cache.layer = 7
    cache.append(*tokens(rng, 5 + 64 + 3))
    twin = pickle.loads(pickle.dumps(cache))
    assert type(twin) is NamedSubclass and twin.layer == 7
    assert_same_cache(cache, twin, rng.standard_normal((2, D)).astype(np.float32))


@pytest.mark.parametrize("cls", [NamedSubclass, NamedFP16Subclass])
def test_deepcopy_copies_a_subclass_attributes_and_copy_shares_them(cls, rng):
    cache = cls(H, D)
    cache.append(*tokens(rng, 5))
    cache.meta = {"steps": [1]}
    deep, shallow = copy.deepcopy(cache), copy.copy(cache)
    deep.meta["steps"].append(2)  # shared with the original before: deepcopy copied only the buffers
    assert cache.meta == {"steps": [1]} and deep.meta == {"steps": [1, 2]}
    assert shallow.meta is cache.meta  # copy.copy: a shallow copy of the attributes, fresh buffers
    if cls is NamedSubclass:  # a checkpoint held by the cache follows it (memo), as in a deep-copied tuple
        cache.held = cache.checkpoint()
        cache.append(*tokens(rng, 3))
        deep = copy.deepcopy(cache)
        deep.rollback(deep.held)
        assert len(deep) == 5 and len(cache) == 8


class LayerCache(kvarn.KVCache):
    """A subclass whose constructor takes other arguments than KVCache's (an engine's per-layer cache)."""

    def __init__(self, layer_idx, num_kv_heads, head_dim, **kw):
        super().__init__(num_kv_heads, head_dim, **kw)
        self.layer_idx = layer_idx


def test_pickle_of_a_subclass_with_its_own_constructor(rng):
    cache = LayerCache(4, H, D, preset="k4v2_g64", sink_tokens=3)
    cache.append(*tokens(rng, 3 + 64 + 9))
    twin = pickle.loads(pickle.dumps(cache))  # raised TypeError (from_parts called LayerCache(H, D, ...))
    assert type(twin) is LayerCache and twin.layer_idx == 4
    assert_same_cache(cache, twin, rng.standard_normal((2, D)).astype(np.float32))
    k, v = tokens(rng, 70)
    cache.append(k, v)
    twin.append(k, v)
    assert_same_cache(cache, twin, rng.standard_normal((2, D)).astype(np.float32))


@pytest.mark.parametrize("cls", [FP16Cache, NamedFP16Subclass])
def test_fp16cache_pickle_round_trip(cls, rng):
    cache = cls(H, D, capacity=1000)
    k, v = tokens(rng, 40)
    cache.append(k, v)
    cache.note = "kept"
    q = rng.standard_normal((4, D)).astype(np.float32)
    for protocol in PROTOCOLS:
        twin = pickle.loads(pickle.dumps(cache, protocol))
        assert type(twin) is cls and twin.note == "kept" and len(twin) == 40
        assert all(same_bytes(x, y) for x, y in zip(cache.keys_values(), twin.keys_values()))
        assert same_bytes(cache.attend(q), twin.attend(q))
        # 40 tokens' bytes (protocol 2 writes them as latin-1 text: up to twice as many), not 1000 tokens'
        assert len(pickle.dumps(cache, protocol)) < 2 * (2 * 2 * H * 40 * D) + 4096
    k2, v2 = tokens(rng, 3)
    twin.append(k2, v2)  # a working lock, and the original is untouched
    assert len(twin) == 43 and len(cache) == 40
    cache.append(k2, v2)
    assert all(same_bytes(x, y) for x, y in zip(cache.keys_values(), twin.keys_values()))
    assert same_bytes(cache.attend(q), twin.attend(q))
    assert type(cache.copy()) is type(copy.copy(cache)) is type(copy.deepcopy(cache)) is cls
    assert copy.deepcopy(cache).note == "kept"


def test_fp16cache_unpickling_checks_what_it_restores(rng):
    """A corrupt pickle is refused where it is read (as KVCache's, through from_parts), not served: a NaN
    in the buffers would make attend report a float32 overflow blamed on the query."""
    cache = FP16Cache(H, D)
    k, v = tokens(rng, 5)
    cache.append(k, v)
    state = cache.__getstate__()
    kbuf, vbuf, length = state["_state"]
    nan_k = np.array(kbuf)
    nan_k[1, 4, 7] = np.nan
    bad_states = [
        ({**state, "_state": (nan_k, vbuf, length)}, "K buffer contains NaN or Inf"),
        ({**state, "_state": (kbuf, vbuf, length + 1)}, r"K buffer must be float16 \[2, 6, 64\]"),
        ({**state, "_state": (kbuf.astype(np.float32), vbuf, length)}, "K buffer must be float16"),
        ({**state, "head_dim": 24}, "head_dim"),
        ({k: val for k, val in state.items() if k != "_state"}, "missing '_state'"),
        ({k: val for k, val in state.items() if k != "num_kv_heads"}, "missing 'num_kv_heads'"),
    ]
    for bad, msg in bad_states:
        with pytest.raises(ValueError, match=msg):
            object.__new__(FP16Cache).__setstate__(bad)
    twin = pickle.loads(pickle.dumps(cache))  # the intact state still loads
    assert all(same_bytes(x, y) for x, y in zip(cache.keys_values(), twin.keys_values()))
    for capacity in (0, 10):  # and an empty cache's (zero-size buffers)
        empty = pickle.loads(pickle.dumps(FP16Cache(H, D, capacity=capacity)))
        assert len(empty) == 0 and empty.keys_values()[0].shape == (H, 0, D)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickling_a_checkpoint_says_what_to_do_instead(protocol, rng):
    cache = kvarn.KVCache(H, D)
    cache.append(*tokens(rng, 10))
    ck = cache.checkpoint()
    for obj in (ck, {"step": 3, "checkpoint": ck}):
        with pytest.raises(TypeError, match=r"checkpoint \(kvarn\.cache\.Checkpoint\).*roll the cache back.*to_parts"):
            pickle.dumps(obj, protocol)
    pickle.dumps(cache, protocol)  # the cache itself pickles


def test_copies_of_a_checkpoint_alone_roll_its_cache_back(rng):
    cache = kvarn.KVCache(H, D, "k4v2_g64", sink_tokens=0)
    cache.append(*tokens(rng, 70))
    ref = cache.to_parts()
    ck = cache.checkpoint()
    cache.append(*tokens(rng, 100))
    assert copy.copy(ck) is ck
    assert copy.deepcopy(ck) is ck
    held = copy.deepcopy({"checkpoints": [ck]})  # a structure of checkpoints, without their cache
    assert held["checkpoints"][0] is ck
    cache.rollback(copy.deepcopy(ck))
    q = rng.standard_normal((2, D)).astype(np.float32)
    assert_same_cache(cache, kvarn.KVCache.from_parts(**ref), q)


def test_deepcopy_of_a_cache_with_its_checkpoints(rng):
    """The copied checkpoints roll the copied cache back to the original checkpoints' content; appends
    and rollbacks on either side leave the other side's cache and checkpoints unchanged."""
    q = rng.standard_normal((4, D)).astype(np.float32)
    cache = kvarn.KVCache(H, D, "k4v2_g64", sink_tokens=8)
    cache.append(*tokens(rng, 8 + 64 + 20))
    ck1, ref1 = cache.checkpoint(), cache.to_parts()
    cache.append(*tokens(rng, 64 + 5))  # a tile more, written in place into the records ck1 also holds
    cache.append(*tokens(rng, 1))  # a tail token in place
    ck2, ref2 = cache.checkpoint(), cache.to_parts()
    cache.append(*tokens(rng, 30))
    ref_now = cache.to_parts()

    pair = copy.deepcopy({"cache": cache, "checkpoints": [ck1, ck2]})
    twin, (ck1b, ck2b) = pair["cache"], pair["checkpoints"]
    assert twin is not cache and ck1b is not ck1 and ck2b is not ck2
    assert (len(ck1b), len(ck2b)) == (len(ck1), len(ck2))
    with pytest.raises(ValueError, match="another cache"):
        cache.rollback(ck1b)
    with pytest.raises(ValueError, match="another cache"):
        twin.rollback(ck1)
    assert_same_cache(twin, kvarn.KVCache.from_parts(**ref_now), q)

    def check(c, ref):
        assert_same_cache(c, kvarn.KVCache.from_parts(**ref), q)

    # The same sequence of rollbacks and appends on both sides gives the same caches.
    for c, (a, b) in ((cache, (ck1, ck2)), (twin, (ck1b, ck2b))):
        c.rollback(a)
        check(c, ref1)
    for m in (1, 64, 1):
        k, v = tokens(rng, m)
        cache.append(k, v)
        twin.append(k, v)
        assert_same_cache(cache, twin, q)
    cache.rollback(ck2)
    twin.rollback(ck2b)
    check(cache, ref2)
    check(twin, ref2)

    # Appends to the copy only: the original cache and its checkpoints do not change.
    before = cache.to_parts()
    for _ in range(3):
        twin.append(*tokens(rng, 70))
        twin.rollback(ck1b)
        twin.append(*tokens(rng, 1))
    check(cache, before)
    cache.rollback(ck1)
    check(cache, ref1)
    cache.rollback(ck2)
    check(cache, ref2)
    # And the other way round.
    before = twin.to_parts()
    for _ in range(3):
        cache.append(*tokens(rng, 70))
        cache.rollback(ck1)
        cache.append(*tokens(rng, 1))
    check(twin, before)
    twin.rollback(ck2b)
    check(twin, ref2)
    twin.rollback(ck1b)
    check(twin, ref1)


def test_a_checkpoint_deep_copied_before_its_cache_stays_itself(rng):
    """Only a cache deep-copied earlier in the same operation is known to be copied: a checkpoint listed
    first stays the original one (it still rolls the original cache back)."""
    cache = kvarn.KVCache(H, D)
    cache.append(*tokens(rng, 5))
    ck = cache.checkpoint()
    ck_b, twin = copy.deepcopy((ck, cache))
    assert ck_b is ck and twin is not cache
    cache.append(*tokens(rng, 5))
    cache.rollback(ck_b)
    assert len(cache) == 5


@pytest.mark.parametrize("how", ["method", "copy", "deepcopy"])
def test_a_subclass_copies_into_its_own_type(how, rng):
    class Mine(kvarn.KVCache):
        def describe(self):
            return f"{len(self)} tokens"

    cache = Mine(H, D, "k4v2_g64", sink_tokens=0)
    cache.layer = 3
    cache.append(*tokens(rng, 70))
    twin = cache.copy() if how == "method" else getattr(copy, how)(cache)
    assert type(twin) is Mine and twin.layer == 3 and twin.describe() == "70 tokens"
    assert_same_cache(cache, twin, rng.standard_normal((2, D)).astype(np.float32))


def test_copy_deepcopy_and_pickle_while_other_threads_attend_and_append(rng):
    """copy(), copy.deepcopy and pickle iterated the cache's live __dict__, to which attend adds its parts cache
    and from which appends remove it: with a fine thread switch interval about 1 call in 500 raised 'dictionary
    changed size during iteration' (a review's 25 s run: 165 in 76,000; this test saw it within its 3 s before the fix)."""
    H, D, n0 = 2, 32, 600
    cache = kvarn.KVCache(H, D)
    x = rng.standard_normal((H, n0, D)).astype(np.float16)
    cache.append(x, x)
    q = rng.standard_normal((H, D)).astype(np.float32)
    stop, errors, copies = threading.Event(), [], [0]

    def churn(writes):  # the parts cache comes and goes: attend adds it, append and truncate drop it
        i = 0
        try:
            while not stop.is_set():
                cache.attend(q)
                if writes:  # one writer: truncation_point and truncate are not atomic together
                    cache.append(x[:, i % n0 : i % n0 + 1], x[:, i % n0 : i % n0 + 1])
                    i += 1
                    if len(cache) > 3000:
                        cache.truncate(cache.truncation_point(n0))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    workers = [threading.Thread(target=churn, args=(writes,)) for writes in (True, False)]
    for w in workers:
        w.start()
    try:
        # 3 s, and on until the race has had its chances (a slow machine gets there later), at most 60 s
        start = time.monotonic()
        while not errors and (time.monotonic() - start < 3.0 or copies[0] <= 100) and time.monotonic() - start < 60.0:
            for fn in (cache.copy, lambda: copy.deepcopy(cache), lambda: pickle.dumps(cache)):
                try:
                    fn()
                    copies[0] += 1
                except RuntimeError as e:
                    errors.append(repr(e))
    finally:
        stop.set()
        for w in workers:
            w.join()
        sys.setswitchinterval(old)
    assert not errors, errors[:3]
    assert copies[0] > 100  # the race had its chances


@pytest.mark.parametrize("quantize_on", ["fill", "next"])
def test_a_copy_shares_the_records_until_its_next_tile(quantize_on, rng):
    """copy() shares the records buffer (O(sink + tail), not O(context): beam search copies caches every step);
    the copy copies it before its first completed tile, the original writes past its tile count, and neither
    then sees the other's records: each equals a cache given its own tokens from scratch."""
    G = 64
    base = tokens(rng, 16 + 3 * G + 20)
    c = kvarn.KVCache(H, D, "k4v2_g64", 16, quantize_on=quantize_on)
    c.append(*base)
    d = c.copy()
    assert d._state[2] is c._state[2]  # the same buffer
    extra_c, extra_d = tokens(rng, G), tokens(rng, G + 5)  # one tile each: the buffer has room for it (capacity 4)
    d.append(*extra_d)
    assert d._state[2] is not c._state[2]
    c.append(*extra_c)
    q = rng.standard_normal((2 * H, D)).astype(np.float32)
    for cache, extra in ((c, extra_c), (d, extra_d)):
        fresh = kvarn.KVCache(H, D, "k4v2_g64", 16, quantize_on=quantize_on)
        fresh.append(*(np.concatenate([b, x], axis=1) for b, x in zip(base, extra)))
        assert_same_cache(cache, fresh, q)


def test_a_copy_survives_the_originals_rollback_below_its_tiles(rng):
    """The original rolled back below the copy's tile count writes its next tiles into a fresh buffer (the one the
    copy shares is frozen), so the copy's records keep their bytes; and the reverse."""
    c = kvarn.KVCache(H, D, "k4v2_g64", 0)
    c.append(*tokens(rng, 64 + 3))
    ck = c.checkpoint()
    c.append(*tokens(rng, 3 * 64))
    d = c.copy()
    held = d.records.copy()
    c.rollback(ck)
    c.append(*tokens(rng, 3 * 64))  # tiles 1-3 again, other tokens
    assert same_bytes(d.records, held)
    ck_d = d.checkpoint()
    e = d.copy()
    d.rollback(ck_d)
    d.truncate(64)
    d.append(*tokens(rng, 2 * 64))
    assert same_bytes(e.records, held)
