"""PagedKVCache.fork: a sequence that starts as a copy of another (parallel sampling, beam search), sharing its
completed tiles' pages, which are copied only when a sequence stores into a tile another one shares.

The GPU tests (skipped, with the reason printed, where there is no CUDA build or GPU) check that a fork and its
parent, each continued with its own tokens (appends, steps, truncations and new tokens in one layer), hold byte for
byte what fresh sequences given the same tokens hold and attend bit for bit alike, and that a refused append
after a copy leaves the cache as it was. The FakeCuda tests (no GPU needed: they run in CI) check the host side:
the pages shared and counted, the rows and block-table entries copied, the copy on write and its undo.
"""
import os
import sys

import numpy as np
import pytest

import kvarn.cuda as kc

sys.path.insert(0, os.path.dirname(__file__))
import test_cuda  # noqa: E402
from test_cuda import FakeDevArray, _seed, _spiky_keys, dev, gpu, kv_like, need_torch  # noqa: E402,F401
from test_cuda_steps import content  # noqa: E402

fake = test_cuda.fake  # the FakeCuda fixture (assigned, not imported: pyflakes takes the tests' argument for a shadow)

LAYERS = 2


# ---- GPU -------------------------------------------------------------------------------------------
def tokens(rng, n, hk, D):
    return kv_like(rng, (1, n, hk, D)), kv_like(rng, (1, n, hk, D))


class Twin:
    """A cache driven through forks, and beside it a cache that gets every sequence's tokens from scratch."""

    def __init__(self, preset, head_dim, hk, max_seqs=4):
        args = dict(num_layers=LAYERS, max_seqs=max_seqs, max_seq_len=1500)
        self.cache = kc.PagedKVCache(hk, head_dim, preset, **args)
        self.fresh = kc.PagedKVCache(hk, head_dim, preset, **args)
        self.tokens = {}  # seq id in cache -> per layer (k, v) host arrays [1, n, hk, D]

    def add(self):
        sid = self.cache.add_sequence()
        self.tokens[sid] = [None] * LAYERS
        return sid

    def append(self, sid, layer, k, v, step_q=None):
        if step_q is None:
            self.cache.append([sid], dev(k), dev(v), layer=layer)
        else:
            self.cache.append_attend(dev(step_q), [sid], dev(k), dev(v), layer=layer)
        old = self.tokens[sid][layer]
        self.tokens[sid][layer] = (k, v) if old is None else tuple(np.concatenate([o, x], axis=1) for o, x in zip(old, (k, v)))

    def fork(self, sid):
        child = self.cache.fork(sid)
        self.tokens[child] = list(self.tokens[sid])
        return child

    def truncate(self, sid, length, layer):
        self.cache.truncate(sid, length, layer=layer)
        self.tokens[sid][layer] = tuple(x[:, :length] for x in self.tokens[sid][layer])

    def check(self, rng, gqa):
        """Every live sequence's content equals a fresh sequence's given its tokens at once, and a batch attend
        over them equals the fresh batch's bit for bit (same lengths, same kernel path)."""
        ids = sorted(self.tokens)
        for sid in list(self.fresh._live):
            self.fresh.free(sid)
        twins = []
        for sid in ids:
            f = self.fresh.add_sequence()
            twins.append(f)
            for layer, kv in enumerate(self.tokens[sid]):
                if kv is not None and kv[0].shape[1]:
                    self.fresh.append([f], dev(kv[0]), dev(kv[1]), layer=layer)
        for layer in range(LAYERS):
            for sid, f in zip(ids, twins):
                assert content(self.cache, sid, layer) == content(self.fresh, f, layer), (sid, layer)
            q = kv_like(rng, (len(ids), self.cache.num_kv_heads * gqa, self.cache.head_dim))
            got = self.cache.attend(dev(q), ids, layer=layer).cpu().numpy()
            want = self.fresh.attend(dev(q), twins, layer=layer).cpu().numpy()
            np.testing.assert_array_equal(got, want)


CASES = [("k4v2_g128", 128, 2, 4), ("k4v2_g128", 128, 1, 8), ("k4v4_g64", 64, 2, 2), ("k2v2_g128", 256, 1, 1)]


@gpu
@need_torch
@pytest.mark.parametrize("preset,head_dim,hk,gqa", CASES)
def test_fork_continues_like_a_fresh_sequence(preset, head_dim, hk, gqa):
    """A prompt forked three ways (parallel sampling), each branch continued with its own tokens across tile
    boundaries, one by a multi-token step; the parent freed before its branches: every branch holds and attends
    exactly what a sequence given its tokens from scratch does, and the prompt's pages are held once."""
    rng = np.random.default_rng(_seed(f"fork-{preset}-{head_dim}"))
    t = Twin(preset, head_dim, hk)
    G = t.cache.preset.group
    parent = t.add()
    for layer in range(LAYERS):
        t.append(parent, layer, *tokens(rng, 5 * G + 37, hk, head_dim))
    free = t.cache.free_pages
    kids = [t.fork(parent) for _ in range(2)]
    assert t.cache.free_pages == free  # shared, not copied
    t.check(rng, gqa)
    for i, sid in enumerate([parent] + kids):
        for layer in range(LAYERS):
            k, v = tokens(rng, 2 * G + 11 * i, hk, head_dim)
            q = kv_like(rng, (1, k.shape[1], hk * gqa, head_dim)) if i == 2 else None
            t.append(sid, layer, k, v, step_q=q)
    t.check(rng, gqa)
    t.cache.free(parent)
    del t.tokens[parent]
    t.check(rng, gqa)
    for sid in kids:
        t.cache.free(sid)
    assert t.cache.free_pages == t.cache.num_pages


@gpu
@need_torch
@pytest.mark.parametrize("use_step", [False, True])
def test_fork_copies_a_shared_page_before_storing_into_it(use_step):
    """A branch truncated to a tile boundary in one layer and given new tokens there stores into tiles whose
    pages it shares: it copies them first (with the other layer's records), and the parent keeps its bytes."""
    rng = np.random.default_rng(_seed(f"fork-cow-{use_step}"))
    t = Twin("k4v2_g128", 128, 2)
    G = 128
    parent = t.add()
    for layer in range(LAYERS):
        t.append(parent, layer, *tokens(rng, 5 * G + 20, 2, 128))  # sink + 4 tiles + 20
    before = [content(t.cache, parent, layer) for layer in range(LAYERS)]
    kid = t.fork(parent)
    t.truncate(kid, 3 * G, layer=1)  # keeps sink + 2 tiles in layer 1; the pages of tiles 2, 3 stay (layer 0)
    free = t.cache.free_pages
    k, v = tokens(rng, 2 * G + 5, 2, 128)
    t.append(kid, 1, k, v, step_q=kv_like(rng, (1, k.shape[1], 8, 128)) if use_step else None)
    assert t.cache.free_pages == free - 2  # tiles 2 and 3 copied
    assert t.cache._pages[kid][:2] == t.cache._pages[parent][:2]
    assert not set(t.cache._pages[kid][2:]) & set(t.cache._pages[parent])
    assert [content(t.cache, parent, layer) for layer in range(LAYERS)] == before
    t.check(rng, 4)


@gpu
@need_torch
def test_refused_step_after_a_copy_changes_nothing():
    """A step that copies a shared page for its first completed tile and is refused at its second (keys the store
    kernel flags: they decode beyond the norm the q check assumes) gives both pages back: pages, counts and
    contents as before, the parent untouched; so does a plain append refused alike (both tiles in one store)."""
    rng = np.random.default_rng(_seed("fork-cow-refused"))
    t = Twin("k4v2_g128", 64, 1)
    parent = t.add()
    for layer in range(LAYERS):
        t.append(parent, layer, *tokens(rng, 4 * 128 + 3, 1, 64))  # sink + 3 tiles + 3
    kid = t.fork(parent)
    t.truncate(kid, 2 * 128, layer=0)  # layer 0: sink + tile 0; the pages of tiles 1, 2 stay held (layer 1)
    state = lambda: (t.cache.free_pages, [list(p) for p in t.cache._pages], t.cache._page_refs.tolist())  # noqa: E731
    was = state()
    contents = {(s, layer): content(t.cache, s, layer) for s in (parent, kid) for layer in range(LAYERS)}
    k, v = tokens(rng, 260, 1, 64)
    k[0, 128:256, 0] = _spiky_keys(12)[0]  # the step's tokens 128..255 complete tile 2
    q = kv_like(rng, (1, 260, 4, 64))
    with pytest.raises(ValueError, match="^k: a tile's keys decode"):
        t.cache.append_attend(dev(q), [kid], dev(k), dev(v), layer=0)
    assert state() == was
    with pytest.raises(ValueError, match="^k: a tile's keys decode"):
        t.cache.append([kid], dev(k), dev(v), layer=0)
    assert state() == was
    assert {key: content(t.cache, *key) for key in contents} == contents
    t.check(rng, 4)


@gpu
def test_2d_copy_wrapper():
    """The strided device copy fork uses: rows land at their pitch, and a row wider than a pitch is refused
    (cudaMemcpy2D's rule) with the argument status, not a CUDA error."""
    src = kc.DeviceArray.from_numpy(np.arange(4 * 16, dtype=np.uint8))
    dst = kc.DeviceArray((4 * 16,), np.uint8).zero_(0)
    assert kc._cuda.memcpy_2d_dtod(dst.ptr, 16, src.ptr, 16, 5, 4, 0) == kc._cuda.OK
    want = np.zeros((4, 16), np.uint8)
    want[:, :5] = np.arange(64, dtype=np.uint8).reshape(4, 16)[:, :5]
    np.testing.assert_array_equal(dst.to_numpy(0).reshape(4, 16), want)
    assert kc._cuda.memcpy_2d_dtod(dst.ptr, 4, src.ptr, 16, 5, 4, 0) == kc._cuda.ERR_ARGUMENT
    assert kc._cuda.memcpy_2d_dtod(dst.ptr, 4, src.ptr, 16, 0, 4, 0) == kc._cuda.OK  # nothing to copy


# ---- FakeCuda (CI) -----------------------------------------------------------------------------------
def fake_cache(fake, hk=2, D=64, num_pages=None, max_seqs=3):
    return kc.PagedKVCache(hk, D, num_layers=LAYERS, max_seqs=max_seqs, max_seq_len=1024, num_pages=num_pages)


def fake_append(fake, cache, sid, n, layers=range(LAYERS), seed=0):
    x = FakeDevArray(fake, kv_like(np.random.default_rng(seed), (1, n, cache.num_kv_heads, cache.head_dim)))
    for layer in layers:
        cache.append([sid], x, x, layer=layer, validate=False)


def host(fake, buf):
    """A writable host view of a cache buffer on the fake device."""
    return fake.mem[buf.ptr].view(buf.dtype).reshape(buf.shape)


def block_table(fake, cache, sid, n):
    return host(fake, cache._block_table)[sid, :n].tolist()


def test_fork_shares_pages_and_copies_the_rows_in_use(fake):
    cache = fake_cache(fake)
    a = cache.add_sequence()
    fake_append(fake, cache, a, 128 + 2 * 128 + 40)  # sink, 2 tiles, 40 tail rows in both layers
    fake_append(fake, cache, a, 100, layers=[1])  # layer 1: a third tile (a page for both layers), 12 rows
    rng = np.random.default_rng(_seed("fork-fake-rows"))
    for name in ("_sink_k", "_sink_v", "_tail_k", "_tail_v"):  # the fake's kernels write nothing: mark the rows
        host(fake, getattr(cache, name))[:, a] = rng.standard_normal(getattr(cache, name).shape[2:]).astype(np.float16)
    free = cache.free_pages
    fake.calls.clear()
    b = cache.fork(a)
    assert b != a and fake.calls == []  # copies only, no kernel
    assert cache._pages[b] == cache._pages[a] and len(cache._pages[a]) == 3 and cache.free_pages == free
    assert cache._page_refs[cache._pages[a]].tolist() == [2, 2, 2]
    assert [cache.length(b, layer) for layer in range(LAYERS)] == [128 + 256 + 40, 128 + 384 + 12]
    assert block_table(fake, cache, b, 3) == cache._pages[a]
    for name, rows in (("_sink_k", (128, 128)), ("_sink_v", (128, 128)), ("_tail_k", (40, 12)), ("_tail_v", (40, 12))):
        buf = host(fake, getattr(cache, name))
        for layer in range(LAYERS):
            n = rows[layer]
            np.testing.assert_array_equal(buf[layer, b, :, :n], buf[layer, a, :, :n])
            assert not buf[layer, b, :, n:].any()  # rows not in use are not read (never written on a GPU)
    cache.free(a)
    assert cache.free_pages == free and cache._page_refs[cache._pages[b]].tolist() == [1, 1, 1]
    cache.free(b)
    assert cache.free_pages == cache.num_pages


def test_fork_refusals_change_nothing(fake):
    cache = fake_cache(fake, max_seqs=2)
    a = cache.add_sequence()
    fake_append(fake, cache, a, 300)
    with pytest.raises(KeyError, match="seq_id: no live sequence with id 1"):
        cache.fork(1)
    with pytest.raises(TypeError, match="seq_id: expected an int"):
        cache.fork("0")
    b = cache.fork(a)
    with pytest.raises(RuntimeError, match="all 2 sequence slots are in use"):
        cache.fork(b)
    assert cache._page_refs[cache._pages[a]].tolist() == [2] and sorted(cache._live) == [a, b]


def test_a_store_into_a_shared_tile_copies_its_page(fake):
    """After a fork, a sequence truncated in one layer and given tokens again stores into tiles it shares: a new
    page takes each one's place, with the records of the layers that hold the tile copied and its block-table
    entry set; the other sequence keeps the page. Storing into a tile it no longer shares copies nothing."""
    cache = fake_cache(fake)
    a = cache.add_sequence()
    fake_append(fake, cache, a, 128 + 3 * 128 + 5)  # 3 tiles in both layers
    pool = host(fake, cache._pool)
    pool[:, cache._pages[a]] = np.random.default_rng(_seed("fork-fake-pool")).integers(
        1, 255, pool[:, cache._pages[a]].shape, dtype=np.uint8)
    b = cache.fork(a)
    shared = list(cache._pages[a])
    cache.truncate(b, 128 + 128, layer=1)  # layer 1 keeps tile 0; tiles 1, 2 stay held for layer 0
    assert cache._pages[b] == shared and cache.free_pages == cache.num_pages - 3
    before = pool.copy()
    fake.log_copies = True
    fake.stream_ops.clear()
    fake_append(fake, cache, b, 256, layers=[1], seed=1)  # completes tiles 1 and 2 in layer 1
    assert cache._pages[a] == shared and cache._pages[b][0] == shared[0]
    new = cache._pages[b][1:]
    assert not set(new) & set(shared) and cache.free_pages == cache.num_pages - 5
    assert cache._page_refs[shared].tolist() == [2, 1, 1] and cache._page_refs[new].tolist() == [1, 1]
    assert sum(op == ("memcpy_dtod",) for op in fake.stream_ops) == 2  # layer 0's record of each: layer 1 had none
    np.testing.assert_array_equal(pool[0, new], before[0, shared[1:]])
    np.testing.assert_array_equal(pool[:, shared], before[:, shared])  # a's pages untouched
    assert block_table(fake, cache, b, 3) == cache._pages[b]  # (a's entries: the store kernel's, not the fake's)
    fake.stream_ops.clear()
    cache.truncate(b, 128 + 128, layer=1)
    fake_append(fake, cache, b, 256, layers=[1], seed=2)  # its own pages now: stored into, not copied
    assert cache._pages[b][1:] == new and ("memcpy_dtod",) not in fake.stream_ops


def test_a_refused_store_gives_the_shared_page_back(fake):
    """An append or a step that copied a shared page and was then refused (the store kernel's flag) leaves the
    pages, their counts and the block table as they were; so does running out of pages part-way."""
    cache = fake_cache(fake, num_pages=4)
    a = cache.add_sequence()
    fake_append(fake, cache, a, 128 + 2 * 128 + 5)  # 2 tiles in both layers
    b = cache.fork(a)
    cache.truncate(b, 128, layer=0)
    state = lambda: ([list(p) for p in cache._pages], cache._page_refs.tolist(), cache.free_pages,  # noqa: E731
                     block_table(fake, cache, a, 2), block_table(fake, cache, b, 2),
                     [cache.length(s, layer) for s in (a, b) for layer in range(LAYERS)])
    was = state()
    x = FakeDevArray(fake, kv_like(np.random.default_rng(3), (1, 200, 2, 64)))
    q = FakeDevArray(fake, kv_like(np.random.default_rng(4), (1, 200, 4, 64)))
    fake.flags_on_store = fake.FLAG_K_SCALE_OVERFLOW
    with pytest.raises(ValueError, match="^k: a tile has values too large"):
        cache.append([b], x, x, layer=0)
    assert state() == was
    with pytest.raises(ValueError, match="^k: a tile has values too large"):
        cache.append_attend(q, [b], x, x, layer=0)
    assert state() == was
    fake.flags_on_store = 0
    real_store, stores = fake.store, []

    def store_flagging_the_second(*args):  # a step's second completed tile refused, after its first (and copy) landed
        stores.append(1)
        fake.flags_on_store = fake.FLAG_K_SCALE_OVERFLOW if len(stores) == 2 else 0
        return real_store(*args)

    fake.store = store_flagging_the_second
    x3 = FakeDevArray(fake, kv_like(np.random.default_rng(3), (1, 300, 2, 64)))
    q3 = FakeDevArray(fake, kv_like(np.random.default_rng(4), (1, 300, 4, 64)))
    with pytest.raises(ValueError, match="^k: a tile has values too large"):
        cache.append_attend(q3, [b], x3, x3, layer=0)  # chunks of 127, 1 (tile 0: copied), 127, 1 (tile 1: refused)
    assert len(stores) == 2 and state() == was
    fake.store, fake.flags_on_store = real_store, 0
    c = cache.fork(a)  # three holders of the two pages; 2 pages free
    cache.truncate(c, 128, layer=0)
    was = state()
    big = FakeDevArray(fake, kv_like(np.random.default_rng(5), (2, 300, 2, 64)))
    with pytest.raises(RuntimeError, match="out of pages"):  # b and c: 2 copies + 1 new tile each > 2 free
        cache.append([b, c], big, big, layer=0)
    assert state() == was
    qq = FakeDevArray(fake, kv_like(np.random.default_rng(6), (2, 300, 4, 64)))
    with pytest.raises(RuntimeError, match="out of pages"):
        cache.append_attend(qq, [b, c], big, big, layer=0)
    assert state() == was


def test_pages_needed_counts_one_copy_less_than_the_sharers(fake):
    """Of n sequences sharing a page that all store into it, n - 1 copy it; the last finds it its own. The
    step's page check counts so, and takes a step that needs exactly the free pages."""
    cache = fake_cache(fake, num_pages=3)
    a = cache.add_sequence()
    fake_append(fake, cache, a, 128 + 128 + 5)  # 1 tile in both layers
    b = cache.fork(a)
    for s in (a, b):
        cache.truncate(s, 128, layer=0)
    ids = [a, b]
    tiles0 = cache._tile_counts(cache._lengths[0, ids])
    assert cache._pages_needed(ids, tiles0, tiles0 + 1) == 1 and cache._pages_needed(ids, tiles0, tiles0 + 2) == 3
    x = FakeDevArray(fake, kv_like(np.random.default_rng(7), (2, 128, 2, 64)))
    q = FakeDevArray(fake, kv_like(np.random.default_rng(8), (2, 128, 4, 64)))
    cache.append_attend(q, ids, x, x, layer=0)  # 1 of the 2 free pages
    assert cache.free_pages == 1 and cache._pages[a] != cache._pages[b]
    assert sorted(cache._page_refs[cache._pages[a] + cache._pages[b]].tolist()) == [1, 1]


def test_load_cpu_into_a_forks_empty_layer_copies_the_shared_pages(fake):
    """load_cpu fills an empty layer of a sequence whose pages a fork shares (other layers hold them): it copies
    them first, so the other sequence's records stay."""
    import kvarn

    cache = fake_cache(fake)
    a = cache.add_sequence()
    fake_append(fake, cache, a, 128 + 2 * 128 + 5, layers=[0])  # layer 1 empty
    pool = host(fake, cache._pool)
    pool[0, cache._pages[a]] = 7
    b = cache.fork(a)
    shared = list(cache._pages[a])
    rng = np.random.default_rng(_seed("fork-load-cpu"))
    cpu = kvarn.KVCache(2, 64)
    cpu.append(kv_like(rng, (2, 128 + 2 * 128 + 9, 64)), kv_like(rng, (2, 128 + 2 * 128 + 9, 64)))
    cache.load_cpu(b, cpu, layer=1)
    assert cache._pages[a] == shared and not set(cache._pages[b]) & set(shared)
    assert (pool[0, cache._pages[b]] == 7).all()  # layer 0's records copied
    np.testing.assert_array_equal(pool[1, cache._pages[b]], cpu.records)
    assert not pool[1, shared].any() and block_table(fake, cache, b, 2) == cache._pages[b]
