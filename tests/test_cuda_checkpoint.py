"""PagedKVCache.checkpoint / rollback: an exact undo of the appends since a checkpoint, completed tiles included (an
engine running a step layer by layer puts the layers done back when a later one refuses the step).

The GPU tests (skipped, with the reason printed, where there is no CUDA build or GPU) check that after steps of 1, 5
and 200 tokens (append and append_attend, across tile edges, ragged sequences, one layer or all) a rollback gives
back the cache's bytes (records, sink and tail) and attention bit for bit, that the sequences then continue exactly as
fresh ones given the same tokens, and the same through a copy on write and a fork made after the checkpoint. The
FakeCuda tests (no GPU needed: they run in CI) check the host side and the bytes the copies move: lengths, pages,
page counts, the free list, block-table entries and tail rows back as they were, refusals that change nothing, and no
device work at all for a one-token checkpoint.
"""
import itertools
import os
import sys

import numpy as np
import pytest

import kvarn
import kvarn.cuda as kc

sys.path.insert(0, os.path.dirname(__file__))
import test_cuda  # noqa: E402
from test_cuda import FakeDevArray, _seed, dev, gpu, kv_like, need_torch, torch  # noqa: E402
from test_cuda_fork import Twin, block_table, fake_append, fake_cache, host, tokens  # noqa: E402
from test_cuda_steps import content  # noqa: E402

fake = test_cuda.fake  # the FakeCuda fixture (assigned, not imported: pyflakes takes the tests' argument for a shadow)


# ---- GPU -------------------------------------------------------------------------------------------
class Log:
    """A GPU cache and the tokens (host float32, [1, n, Hk, D]) each of its sequences holds per layer, to give a fresh
    cache the same tokens in one append."""

    def __init__(self, preset, head_dim, hk, num_layers, dtype, max_seqs=4):
        self.args = dict(num_layers=num_layers, max_seqs=max_seqs, max_seq_len=2000)
        self.shape = (hk, head_dim, preset)
        self.cache = kc.PagedKVCache(hk, head_dim, preset, **self.args)
        self.dtype, self.tokens = getattr(torch, dtype), {}

    def add(self):
        sid = self.cache.add_sequence()
        empty = np.zeros((1, 0, self.cache.num_kv_heads, self.cache.head_dim), np.float32)
        self.tokens[sid] = [[empty, empty] for _ in range(self.cache.num_layers)]
        return sid

    def dev(self, x):
        return dev(x, self.dtype)

    def log(self, ids, layer, k, v):
        for b, sid in enumerate(ids):
            kv = self.tokens[sid][layer]
            self.tokens[sid][layer] = [np.concatenate([kv[0], k[b:b + 1]], axis=1),
                                       np.concatenate([kv[1], v[b:b + 1]], axis=1)]

    def contents(self):
        return {(sid, layer): content(self.cache, sid, layer) for sid in self.tokens
                for layer in range(self.cache.num_layers)}

    def attends(self, rng, gqa=2):
        """Batch attends over every sequence, per layer (same queries for the same rng state)."""
        ids, c = sorted(self.tokens), self.cache
        outs = []
        for layer in range(c.num_layers):
            q = kv_like(rng, (len(ids), c.num_kv_heads * gqa, c.head_dim))
            outs.append(c.attend(self.dev(q), ids, layer=layer).float().cpu().numpy())
        return outs

    def check_fresh(self, rng, gqa=2):
        """Every sequence equals a fresh one given its tokens in one append, and attends bit for bit alike."""
        hk, D, preset = self.shape
        fresh = kc.PagedKVCache(hk, D, preset, **self.args)
        ids = sorted(self.tokens)
        twins = [fresh.add_sequence() for _ in ids]
        for sid, f in zip(ids, twins):
            for layer, (k, v) in enumerate(self.tokens[sid]):
                if k.shape[1]:
                    fresh.append([f], self.dev(k), self.dev(v), layer=layer)
                assert content(self.cache, sid, layer) == content(fresh, f, layer), (sid, layer)
        for layer in range(self.cache.num_layers):
            q = self.dev(kv_like(rng, (len(ids), hk * gqa, D)))
            np.testing.assert_array_equal(self.cache.attend(q, ids, layer=layer).float().cpu().numpy(),
                                          fresh.attend(q, twins, layer=layer).float().cpu().numpy())


def step(log, rng, ids, n, layers, refuse_one=False):
    """n tokens per sequence into each of layers: the first layer through append_attend, the others through append,
    n > 1 split in two calls (a checkpoint covers any number of calls); refuse_one: an append refused (NaN) first."""
    c = log.cache
    B, hk, D = len(ids), c.num_kv_heads, c.head_dim
    for i, layer in enumerate(layers):
        k, v = kv_like(rng, (B, n, hk, D)), kv_like(rng, (B, n, hk, D))
        if refuse_one:
            bad = k.copy()
            bad[-1, -1, 0, 0] = np.nan
            with pytest.raises(ValueError, match="^k: contains NaN or Inf"):
                c.append(ids, log.dev(bad), log.dev(v), layer=layer)
        for lo, hi in ((0, n // 2), (n // 2, n)) if n > 1 else ((0, n),):
            if hi == lo:
                continue
            kk, vv = log.dev(k[:, lo:hi]), log.dev(v[:, lo:hi])
            if i == 0:
                q = log.dev(kv_like(rng, (B, hi - lo, hk * 2, D)))
                c.append_attend(q, ids, kk, vv, layer=layer)
            else:
                c.append(ids, kk, vv, layer=layer)
        yield layer, k, v


GPU_CASES = [("k4v2_g128", 128), ("k4v2_g128", 64), ("k4v4_g64", 64), ("k4v4_g64", 128)]


@gpu
@need_torch
@pytest.mark.parametrize("preset,head_dim", GPU_CASES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("num_layers,layer", [(1, None), (2, None), (2, 1)])
def test_rollback_gives_back_bytes_and_attention(preset, head_dim, dtype, num_layers, layer):
    """Ragged sequences (in the sink, a tile's rows nearly full, several tiles) take steps of 1, 5 and 200 tokens
    after a checkpoint (tiles complete, their tail rows reused; 5 with an append refused first); rollback gives the
    bytes (records, sink, tail rows) and batch attention of before bit for bit; a second step and rollback to the
    same checkpoint again; then the sequences keep other tokens, and every one equals a fresh sequence given its
    tokens (content, and attention bit for bit)."""
    rng = np.random.default_rng(_seed("ckpt", preset, head_dim, dtype, num_layers, layer))
    log = Log(preset, head_dim, 2, num_layers, dtype)
    G = kvarn.PRESETS[preset].group
    ids = [log.add() for _ in range(4)]
    layers = list(range(num_layers)) if layer is None else [layer]
    for sid, n0 in zip(ids, (G - 3, 2 * G - 2, 4 * G + 30, 7)):  # sink = G
        for lay in range(num_layers):
            k, v = kv_like(rng, (1, n0 + lay, 2, head_dim)), kv_like(rng, (1, n0 + lay, 2, head_dim))
            log.cache.append([sid], log.dev(k), log.dev(v), layer=lay)
            log.log([sid], lay, k, v)
    for n in (1, 5, 200):
        before, free = log.contents(), log.cache.free_pages
        seed = int(rng.integers(2**31))
        want = log.attends(np.random.default_rng(seed))
        point = log.cache.checkpoint(ids, n, layer=layer)
        for again in range(2):
            lens = {(s, lay): log.cache.length(s, lay) for s in ids for lay in range(num_layers)}
            for _ in step(log, rng, ids, n, layers, refuse_one=n == 5 and not again):
                pass
            for (s, lay), n0 in lens.items():
                assert log.cache.length(s, lay) == n0 + (n if lay in layers else 0)
            log.cache.rollback(point)
            assert log.contents() == before and log.cache.free_pages == free, (n, again)
            got = log.attends(np.random.default_rng(seed))
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        for lay, k, v in step(log, rng, ids, n, layers):  # kept: other tokens than the rolled-back ones
            log.log(ids, lay, k, v)
    log.check_fresh(rng)


@gpu
@need_torch
def test_rollback_through_a_copy_on_write_and_a_fork():
    """A fork truncated to a tile boundary in one layer takes a step that copies the pages it shares (copy on write);
    rollback gives it the shared pages back (both sequences' bytes as before, the pool's free pages too). Then a step
    and a fork of the stepped sequence, and a rollback of the original: the fork keeps the step, the original does
    not, and both equal fresh sequences given their tokens."""
    rng = np.random.default_rng(_seed("ckpt-cow"))
    t = Twin("k4v2_g128", 128, 2)
    G = 128
    parent = t.add()
    for layer in range(2):
        t.append(parent, layer, *tokens(rng, 5 * G + 20, 2, 128))  # sink + 4 tiles + 20
    kid = t.fork(parent)
    t.truncate(kid, 3 * G, layer=1)  # layer 1: sink + 2 tiles; the pages of tiles 2, 3 stay shared (layer 0)
    both = [(s, layer) for s in (parent, kid) for layer in range(2)]
    before = {key: content(t.cache, *key) for key in both}
    free, logged = t.cache.free_pages, {s: list(x) for s, x in t.tokens.items()}
    point = t.cache.checkpoint([kid], 2 * G + 5, layer=1)
    k, v = tokens(rng, 2 * G + 5, 2, 128)
    t.append(kid, 1, k, v, step_q=kv_like(rng, (1, k.shape[1], 8, 128)))
    assert t.cache.free_pages == free - 2  # tiles 2 and 3 copied
    t.cache.rollback(point)
    t.tokens = {s: list(x) for s, x in logged.items()}
    assert {key: content(t.cache, *key) for key in both} == before and t.cache.free_pages == free
    assert t.cache._pages[kid] == t.cache._pages[parent]
    t.check(rng, 4)
    point = t.cache.checkpoint([parent], 150)
    for layer in range(2):
        t.append(parent, layer, *tokens(rng, 150, 2, 128))  # completes a tile: a new page
    branch = t.fork(parent)
    t.cache.rollback(point)
    t.tokens[parent] = logged[parent]
    t.check(rng, 4)
    for layer in range(2):  # the rolled-back sequence continues with other tokens
        t.append(parent, layer, *tokens(rng, 150, 2, 128))
    t.check(rng, 4)
    assert t.cache.length(branch, 0) == t.cache.length(parent, 0)


@gpu
@need_torch
@pytest.mark.parametrize("bad", ["k", "q"])
def test_a_flagged_deferred_step_that_completes_a_tile_reads_its_own_page(bad):
    """A deferred step (validate=False, flags=) whose token completes a tile and whose checks flag it (NaN k: the
    store kernel skips the tile; NaN q: it stores it) still points the block table at the tile's new page before
    its attend reads the tile (a stale entry, here set to another page, was read; one outside the pool faulted:
    an illegal address, s96). The flags name the fault; rollback gives back the cache as it was."""
    rng = np.random.default_rng(_seed("ckpt-flagged-tile-" + bad))
    cache = kc.PagedKVCache(2, 128, max_seqs=1, max_seq_len=1024)
    s = cache.add_sequence()
    cache.append([s], dev(kv_like(rng, (1, 255, 2, 128))), dev(kv_like(rng, (1, 255, 2, 128))))  # sink + 127
    new = cache._free_pages[-1]  # the page the step's tile takes
    stale = np.array([(new + 1) % cache.num_pages], np.int32)
    kc._cuda.memcpy_htod(cache._block_table.ptr + s * cache.max_tiles * 4, stale.view(np.uint8), 0)
    before = content(cache, s, 0)
    q, k, v = (kv_like(rng, (1, 1, h, 128)) for h in (8, 2, 2))
    (k if bad == "k" else q)[0, 0, 1, 5] = np.nan
    flags = torch.zeros(1, dtype=torch.int32, device="cuda")
    point = cache.checkpoint([s], 1)
    cache.append_attend(dev(q), [s], dev(k), dev(v), validate=False, flags=flags)
    assert str(kc.flags_error(int(flags.item()))) == f"{bad}: contains NaN or Inf"
    assert block_table_row(cache, s)[0] == new == cache._pages[s][0]
    cache.rollback(point)
    assert content(cache, s, 0) == before and cache.length(s) == 255
    k[0, 0, 1, 5] = q[0, 0, 1, 5] = 0.5
    cache.append_attend(dev(q), [s], dev(k), dev(v))  # validated: the same step goes through
    assert cache.length(s) == 256 and block_table_row(cache, s)[0] == cache._pages[s][0]


def test_the_page_pool_starts_zeroed(fake, monkeypatch):
    """A deferred step that its checks flag skips its tile's store and still attends the page (the case above): the
    pool is zeroed when the cache is made, so that read is of defined bytes (compute-sanitizer initcheck reported the
    page's record as uninitialised, s98a), whatever the allocator handed out."""
    real_malloc = fake.malloc

    def malloc_filled(n):  # bytes that are not zeros (FakeCuda's own malloc zeroes)
        rc, ptr = real_malloc(n)
        fake.memset(ptr, 0xA5, n, 0)
        return rc, ptr

    monkeypatch.setattr(fake, "malloc", malloc_filled)
    cache = kc.PagedKVCache(2, 128, max_seqs=2, max_seq_len=1024, num_layers=2)
    assert not host(fake, cache._pool).any() and not host(fake, cache._block_table).any()
    assert host(fake, cache._tail_k).all()  # the allocator's bytes: only what must be zeroed is


def block_table_row(cache, s):
    row = np.empty(cache.max_tiles, np.int32)
    kc._cuda.memcpy_dtoh(row.view(np.uint8), cache._block_table.ptr + s * cache.max_tiles * 4, 0)
    return row.tolist()


# ---- FakeCuda (CI) -----------------------------------------------------------------------------------
def writing_rows(fake, monkeypatch, cache):
    """FakeCuda's write_tokens writes nothing; this one writes each token where the kernel puts it (the sink below
    its end, the tail from the first tail position on: the rows of a tile the call completes are reused), a counter
    as its value, unless the flag is set; so a test sees rows overwritten and put back."""
    bufs = {name: host(fake, getattr(cache, name)) for name in ("_sink_k", "_sink_v", "_tail_k", "_tail_v")}
    counter = itertools.count(1)

    def write_tokens(desc, layer, k, v, meta, meta_bytes, B, flag, stream):
        fake.calls.append("write_tokens")
        buf, off = fake._find(flag, 4)
        if buf[off:off + 4].view(np.int32)[0]:
            return 0
        buf, off = fake._find(meta, 12 * B)
        for slot, before, first_tail in buf[off:off + 12 * B].view(np.int32).reshape(B, 3).tolist():
            for t in range(k[2][1]):
                pos, mark = before + t, next(counter) % 2000 + 1
                if pos < cache.sink_tokens:
                    bufs["_sink_k"][layer, slot, :, pos] = mark
                    bufs["_sink_v"][layer, slot, :, pos] = -mark
                elif pos >= first_tail:
                    bufs["_tail_k"][layer, slot, :, pos - first_tail] = mark
                    bufs["_tail_v"][layer, slot, :, pos - first_tail] = -mark
        return 0

    monkeypatch.setattr(fake, "write_tokens", write_tokens)
    rng = np.random.default_rng(_seed("ckpt-rows"))
    for b in bufs.values():  # what the rows held before (random, unlike any mark)
        b[:] = rng.standard_normal(b.shape).astype(np.float16)


def state(fake, cache, sids=None):
    """What rollback restores, for sequences sids (default: every live one): lengths, pages, block-table entries in
    use, the sink and tail rows in use and the records of the pages they hold; and the pool's counts and free list."""
    G = cache.preset.group
    bufs = [host(fake, getattr(cache, name)) for name in ("_sink_k", "_sink_v", "_tail_k", "_tail_v")]
    pool = host(fake, cache._pool)
    seqs = []
    for sid in sorted(cache._live) if sids is None else sids:
        pages = list(cache._pages[sid])
        rows = []
        for layer in range(cache.num_layers):
            n = cache.length(sid, layer)
            sink = min(n, cache.sink_tokens)
            tail = n - sink - int(cache._tile_counts(n)) * G
            rows.append((n, *(b[layer, sid, :, :m].tobytes() for b, m in zip(bufs, (sink, sink, tail, tail)))))
        seqs.append((sid, pages, block_table(fake, cache, sid, len(pages)), rows, pool[:, pages].tobytes()))
    return seqs, cache._page_refs.tolist(), list(cache._free_pages)


def everything(fake, cache):
    """The whole host state and every device byte of the cache's own buffers (nothing may change at all)."""
    return (cache._lengths.tolist(), [list(p) for p in cache._pages], cache._page_refs.tolist(),
            list(cache._free_pages), sorted(cache._live), list(cache._free_slots), cache._versions.tolist(),
            cache._page_gen.tolist(), cache._epoch,
            *(host(fake, getattr(cache, name)).tobytes() for name in ("_pool", "_sink_k", "_sink_v", "_tail_k",
                                                                      "_tail_v", "_block_table")))


def fake_step(fake, cache, ids, n, layers, how, seed=0):
    """n tokens into each of ids in each of layers: "append" (one call), "append_attend", or "split" (appends of 1
    and n - 1)."""
    rng = np.random.default_rng(seed)
    hk, D = cache.num_kv_heads, cache.head_dim
    for layer in layers:
        x = kv_like(rng, (len(ids), n, hk, D))
        if how == "append_attend":
            q = FakeDevArray(fake, kv_like(rng, (len(ids), n, 2 * hk, D)))
            cache.append_attend(q, ids, FakeDevArray(fake, x), FakeDevArray(fake, x), layer=layer)
        else:
            parts = (x[:, :1], x[:, 1:]) if how == "split" else (x,)
            for p in parts:
                if p.shape[1]:
                    cache.append(ids, FakeDevArray(fake, p), FakeDevArray(fake, p), layer=layer)


def ragged(fake, cache, lengths):
    """Sequences of these lengths in every layer (layer l: l tokens more)."""
    ids = []
    for n0 in lengths:
        sid = cache.add_sequence()
        for layer in range(cache.num_layers):
            fake_append(fake, cache, sid, n0 + layer, layers=[layer], seed=sid)
        ids.append(sid)
    return ids


def test_rollback_of_appends_that_complete_no_tile(fake, monkeypatch):
    """Appends inside the tail (and the sink): the checkpoint copies nothing; rollback gives every length and row
    in use back, and nothing else changed."""
    cache = fake_cache(fake)
    writing_rows(fake, monkeypatch, cache)
    ids = ragged(fake, cache, (100, 128 + 40, 300))
    was = state(fake, cache)
    fake.log_copies = True
    fake.stream_ops.clear()
    point = cache.checkpoint(ids, 20)
    assert fake.stream_ops == [] and point._buf is None
    fake_step(fake, cache, ids, 20, range(2), "append")
    assert state(fake, cache) != was
    cache.rollback(point)
    assert state(fake, cache) == was


@pytest.mark.parametrize("how", ["append", "append_attend", "split"])
@pytest.mark.parametrize("n", [1, 5, 200])
@pytest.mark.parametrize("layer", [None, 1])
def test_rollback_of_steps_that_complete_tiles(fake, monkeypatch, how, n, layer):
    """Ragged sequences (completing a tile at the step's first or second token, in the sink, long) take n tokens in the checkpoint's layers: tiles complete (new pages) and the tokens after them
    overwrite tail rows; rollback gives back lengths, pages, counts, the free list (in its order), block-table
    entries and the rows in use; a second step and rollback to the same checkpoint do it again."""
    cache = fake_cache(fake, max_seqs=4)
    writing_rows(fake, monkeypatch, cache)
    ids = ragged(fake, cache, (255, 254, 60, 128 + 3 * 128 + 100))
    layers = [0, 1] if layer is None else [layer]
    was = state(fake, cache)
    point = cache.checkpoint(ids, n, layer=layer)
    for again in range(2):
        fake_step(fake, cache, ids, n, layers, how, seed=again)
        assert cache.free_pages < len(was[2])  # tiles completed
        assert state(fake, cache) != was
        cache.rollback(point)
        assert state(fake, cache) == was, again


def test_a_one_token_checkpoint_does_no_device_work(fake, monkeypatch):
    """A decode step's checkpoint (n_tokens=1) copies nothing and records nothing on the device, even where the token
    completes a tile (the token completing a tile is stored, not written to a row); a larger one copies exactly the
    rows in use that the tokens after a completed tile would overwrite, per layer, tail buffer and sequence (one
    strided copy each), on the default stream after kvarn's queued work."""
    cache = fake_cache(fake, max_seqs=4)
    writing_rows(fake, monkeypatch, cache)
    ids = ragged(fake, cache, (255, 253, 60, 128 + 40))
    fake.log_copies = True
    fake.stream_ops.clear()
    fake.calls.clear()
    point = cache.checkpoint(ids, 1)
    assert fake.stream_ops == [] and fake.calls == [] and point._buf is None and point._saved == []
    was = state(fake, cache)
    fake_step(fake, cache, ids, 1, range(2), "append")
    cache.rollback(point)
    assert state(fake, cache) == was
    fake.stream_ops.clear()
    point = cache.checkpoint(ids, 5)
    # 255 tokens in layer 0 (127 tail rows) complete a tile at the step's first token (4 rows after it; in layer 1,
    # 256 tokens: no tail rows), 253 / 254 at its 3rd / 2nd (2 / 3 rows): 3 (layer, sequence) pairs with rows to
    # save, times the k and v tails
    assert [op[0] for op in fake.stream_ops] == ["memcpy_2d_dtod"] * 6 + ["record"]
    assert [(w // (64 * 2)) for _, _, w in point._saved] == [4, 2, 3] * 2
    assert point._buf.nbytes == 2 * 2 * 64 * 2 * (4 + 2 + 3)


@pytest.mark.parametrize("layer", [1, None])
def test_rollback_takes_back_a_page_copied_on_write(fake, monkeypatch, layer):
    """A fork truncated to a tile boundary in layer 1 and given tokens there copies the pages it shares (copy on
    write); rollback gives it the shared pages back: counts, the free list, its block-table entries, and the records
    (the parent's untouched); again after a second step. A fork made after the checkpoint keeps what it shares.
    With a checkpoint of every layer (layer None), the pages it keeps start at the shortest layer's tile count (layer
    1's 1, not layer 0's 3)."""
    cache = fake_cache(fake)
    writing_rows(fake, monkeypatch, cache)
    a = cache.add_sequence()
    fake_append(fake, cache, a, 128 + 3 * 128 + 5)  # 3 tiles in both layers
    pool = host(fake, cache._pool)
    pool[:, cache._pages[a]] = np.random.default_rng(_seed("ckpt-pool")).integers(
        1, 255, pool[:, cache._pages[a]].shape, dtype=np.uint8)
    b = cache.fork(a)
    shared = list(cache._pages[a])
    cache.truncate(b, 128 + 128, layer=1)  # layer 1 keeps tile 0; tiles 1, 2 stay shared for layer 0
    was = state(fake, cache)
    point = cache.checkpoint([b], 300, layer=layer)
    for seed in range(2):
        fake_step(fake, cache, [b], 260, [1], "append_attend" if seed else "append", seed=seed)
        assert cache._pages[b][0] == shared[0] and not set(cache._pages[b][1:]) & set(shared)
        assert cache._page_refs[shared].tolist() == [2, 1, 1]
        assert block_table(fake, cache, b, 3)[1:] == cache._pages[b][1:3]
        cache.rollback(point)
        assert state(fake, cache) == was and cache._pages[b] == shared
        assert cache._page_refs[shared].tolist() == [2, 2, 2]
    fake_step(fake, cache, [b], 260, [1], "append", seed=2)
    c = cache.fork(b)  # holds b's copies
    kept = state(fake, cache, [c])[0]
    cache.rollback(point)
    assert state(fake, cache, [a, b])[0] == was[0] and state(fake, cache, [c])[0] == kept
    assert cache._page_refs[cache._pages[c]].tolist() == [3, 1, 1] and cache._page_refs[shared].tolist() == [3, 2, 2]
    cache.free(c)
    assert state(fake, cache) == was


def test_a_fork_made_after_the_checkpoint_keeps_the_step(fake, monkeypatch):
    """A step completes a tile (a new page), a fork shares it, the original is rolled back: the original as at the
    checkpoint, the fork with the step (its length, rows, pages and entries as right after the fork), and the new
    page is the fork's alone; freeing the fork gives the pool back as it was at the checkpoint."""
    cache = fake_cache(fake)
    writing_rows(fake, monkeypatch, cache)
    a = ragged(fake, cache, (128 + 128 + 100,))[0]
    was = state(fake, cache)
    point = cache.checkpoint([a], 64)
    fake_step(fake, cache, [a], 64, range(2), "append_attend")
    c = cache.fork(a)
    forked = state(fake, cache, [c])[0]
    cache.rollback(point)
    assert state(fake, cache, [a])[0] == was[0] and state(fake, cache, [c])[0] == forked
    new = cache._pages[c][-1]
    assert new not in cache._pages[a] and cache._page_refs[new] == 1
    cache.free(c)
    assert state(fake, cache) == was


def test_a_page_given_back_is_taken_back_unless_reused(fake):
    """The page a copy on write replaced goes back to the pool when its other holder is freed: rollback takes it out
    of the free list (its records intact); once another sequence took it (or its holder stored into it in place),
    rollback refuses and changes nothing."""
    for case in ("pool", "taken", "stored"):
        cache = fake_cache(fake, num_pages=8)
        a = cache.add_sequence()
        fake_append(fake, cache, a, 128 + 2 * 128 + 5)  # 2 tiles
        b = cache.fork(a)
        shared = list(cache._pages[a])
        cache.truncate(b, 128 + 128, layer=1)
        if case == "stored":
            cache.truncate(a, 128 + 128, layer=1)
        was = state(fake, cache, [b])[0]
        point = cache.checkpoint([b], 200, layer=1)
        fake_append(fake, cache, b, 200, layers=[1], seed=1)  # completes tile 1 in layer 1: copies its page
        assert cache._pages[b][1] != shared[1]
        if case == "stored":
            fake_append(fake, cache, a, 200, layers=[1], seed=2)  # a is tile 1's only holder now: in place
            assert cache._pages[a] == shared
        else:
            cache.free(a)
            assert shared[1] in cache._free_pages
        if case == "taken":
            c = cache.add_sequence()
            while shared[1] in cache._free_pages:
                fake_append(fake, cache, c, 128, layers=[0], seed=3)
        if case == "pool":
            cache.rollback(point)
            assert state(fake, cache, [b])[0] == was and cache._page_refs[shared].tolist() == [1, 1]
            assert not set(shared) & set(cache._free_pages)
            assert len(cache._free_pages) == cache.num_pages - 2
        else:
            before = everything(fake, cache)
            with pytest.raises(ValueError, match=f"^checkpoint: page {shared[1]} .* reused or stored into"):
                cache.rollback(point)
            assert everything(fake, cache) == before


def test_rollback_refusals_change_nothing(fake, monkeypatch):
    """What a checkpoint cannot undo is refused, with ValueError (TypeError for something else than a checkpoint)
    naming the checkpoint and the problem, and the cache left exactly as it was: another cache's checkpoint, a
    sequence truncated, freed (and its slot taken again), loaded from the CPU, given more tokens than n_tokens, or
    tokens in a layer outside the checkpoint, or moved by a rollback to a later checkpoint. Bad checkpoint()
    arguments are refused too."""
    cache = fake_cache(fake)
    writing_rows(fake, monkeypatch, cache)
    a, b = ragged(fake, cache, (200, 300))

    def refused(point, error, match):
        before = everything(fake, cache)
        with pytest.raises(error, match=match):
            cache.rollback(point)
        assert everything(fake, cache) == before

    for what in ("x", None, cache):
        refused(what, TypeError, "^checkpoint: expected a StepCheckpoint")
    other = fake_cache(fake)
    refused(other.checkpoint(other.add_sequence(), 3), ValueError, "^checkpoint: made by another PagedKVCache")
    point = cache.checkpoint([a, b], 10)
    fake_append(fake, cache, a, 11, layers=[1])
    refused(point, ValueError, f"^checkpoint: sequence {a} received 11 tokens since the checkpoint, more than its "
            "n_tokens=10 in layer 1")
    point = cache.checkpoint([a, b], 10, layer=0)
    fake_append(fake, cache, b, 2, layers=[1])
    refused(point, ValueError, rf"^checkpoint: sequence {b} changed length \(301 -> 303\) outside the checkpoint's "
            "layer in layer 1")
    point = cache.checkpoint([a, b], 10)
    fake_append(fake, cache, a, 4)
    cache.truncate(a, cache.length(a, 0) - 2, layer=0)
    refused(point, ValueError, f"^checkpoint: sequence {a} was freed, truncated, loaded or rolled back")
    point = cache.checkpoint([a, b], 10)
    cache.truncate(a, cache.length(a, 1), layer=1)  # even one that keeps every token
    refused(point, ValueError, f"^checkpoint: sequence {a} was freed, truncated")
    # a rollback to an earlier checkpoint moves the sequence: a later one no longer applies, the earlier one does
    early = cache.checkpoint([b], 20)
    fake_append(fake, cache, b, 5)
    late = cache.checkpoint([b], 20)
    fake_append(fake, cache, b, 5)
    cache.rollback(early)
    fake_append(fake, cache, b, 5, seed=9)  # the late checkpoint's lengths again, other tokens
    refused(late, ValueError, f"^checkpoint: sequence {b} was freed, truncated, loaded or rolled back to another")
    cache.rollback(early)
    # freed; freed and the slot taken again
    point = cache.checkpoint([b, a], 10)
    cache.free(a)
    refused(point, ValueError, f"^checkpoint: sequence {a} was freed")
    assert cache.add_sequence() == a
    refused(point, ValueError, f"^checkpoint: sequence {a} was freed")
    # load_cpu into the checkpoint's empty layer
    point = cache.checkpoint([a], 500, layer=0)
    cpu = kvarn.KVCache(2, 64)
    rng = np.random.default_rng(_seed("ckpt-load"))
    cpu.append(kv_like(rng, (2, 40, 64)), kv_like(rng, (2, 40, 64)))
    cache.load_cpu(a, cpu, layer=1)
    refused(point, ValueError, f"^checkpoint: sequence {a} was freed, truncated, loaded")
    # checkpoint's own arguments
    before = everything(fake, cache)
    for kw, error, match in ((dict(n_tokens=-1), ValueError, "^n_tokens"), (dict(n_tokens="3"), TypeError, "^n_tokens"),
                             (dict(layer=2), ValueError, r"^layer: 2 is outside \[0, 2\)"),
                             (dict(seq_ids=[a, a]), ValueError, "^seq_ids: a sequence appears twice"),
                             (dict(seq_ids=[3]), KeyError, "seq_ids"), (dict(seq_ids=[]), ValueError, "^seq_ids")):
        args = dict(seq_ids=[a, b], n_tokens=3)
        args.update(kw)
        with pytest.raises(error, match=match):
            cache.checkpoint(args.pop("seq_ids"), args.pop("n_tokens"), **args)
    assert everything(fake, cache) == before


def test_a_rollback_that_changes_nothing_keeps_other_checkpoints(fake):
    """A rollback with nothing appended since (a step refused in its first layer) moves nothing: the other
    checkpoints of the sequence still apply; one that moved it invalidates them, but not itself."""
    cache = fake_cache(fake)
    a = ragged(fake, cache, (300,))[0]
    first = cache.checkpoint([a], 4)
    second = cache.checkpoint([a], 4)
    cache.rollback(second)
    fake_append(fake, cache, a, 4)
    cache.rollback(first)
    with pytest.raises(ValueError, match="^checkpoint: sequence .* rolled back to another state"):
        cache.rollback(second)
    fake_append(fake, cache, a, 4)
    cache.rollback(first)
    assert [cache.length(a, layer) for layer in range(2)] == [300, 301]
