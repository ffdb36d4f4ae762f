"""PagedKVCache.append_attend: multi-token steps on the GPU (a draft to verify, a chunk of prompt).

The GPU tests (skipped, with the reason printed, where there is no CUDA build or GPU) check each token's
output bit for bit against appending the tokens one at a time and attending after each, the cache's
content byte for byte, every token against the float64 oracle, and that a refused step leaves the cache as
it was. The FakeCuda tests (no GPU needed: they run in CI) check the host side: the chunks, the metadata
rows and q/out slices each launch gets, the refusals before any kernel, and the undo of a step refused
after some of its chunks landed.
"""
import os
import sys

import numpy as np
import pytest

import kvarn
import kvarn.cuda as kc

sys.path.insert(0, os.path.dirname(__file__))
import test_cuda  # noqa: E402
from test_cuda import (FakeDevArray, _seed, _spiky_keys, check_against_cpu, dev, force_splits,  # noqa: E402,F401
                       gpu, kv_like, need_torch, torch)

fake = test_cuda.fake  # the FakeCuda fixture (assigned, not imported: pyflakes takes the tests' argument for a shadow)


# ---- GPU -------------------------------------------------------------------------------------------
def prefilled(preset, head_dim, hk, lengths, seed, sink=None, max_seq_len=2000):
    """A GPU cache holding one sequence per length (0 allowed) of kv_like tokens, appended at once, and the
    host copies of every token it was given (fp16, [Hk, n, D] per sequence). Same seed, same cache."""
    rng = np.random.default_rng(seed)
    cache = kc.PagedKVCache(hk, head_dim, preset, max_seqs=len(lengths), max_seq_len=max_seq_len, sink_tokens=sink)
    ids, host = [], []
    for n in lengths:
        sid = cache.add_sequence()
        k, v = kv_like(rng, (1, n, hk, head_dim)), kv_like(rng, (1, n, hk, head_dim))
        if n:
            cache.append([sid], dev(k), dev(v))
        ids.append(sid)
        host.append([x[0].astype(np.float16).transpose(1, 0, 2) for x in (k, v)])
    return cache, ids, host


def step_inputs(seed, B, n, hq, hk, D):
    rng = np.random.default_rng(seed)
    return kv_like(rng, (B, n, hq, D)), kv_like(rng, (B, n, hk, D)), kv_like(rng, (B, n, hk, D))


def content(cache, sid, layer=0):
    """Everything the cache holds for a sequence (in a layer), as bytes: length, records, sink and tail rows."""
    parts = cache.to_cpu(sid, layer).to_parts()
    return (cache.length(sid, layer), cache.records(sid, layer).tobytes(),
            *(np.asarray(parts[name]).tobytes() for name in ("sink_k", "sink_v", "tail_k", "tail_v")))


# (preset, head_dim, gqa): every instance family (D 64 / 128 / 256, k4v2_g128's swapped-operand tiles at
# GQA <= 4 and its row-split layout above).
CASES = [("k4v2_g128", 128, 4), ("k4v2_g128", 128, 8), ("k4v4_g64", 64, 2), ("k2v2_g128", 256, 2), ("k4v2_g64", 128, 1)]


@gpu
@need_torch
@pytest.mark.parametrize("preset,head_dim,gqa", CASES)
@pytest.mark.parametrize("n", [1, 4, 9, 70])
def test_step_equals_one_token_at_a_time(preset, head_dim, gqa, n):
    """Each token's output equals attend() after appending the tokens one at a time, bit for bit, and the
    cache ends with the same bytes. The lengths put the step across the sink's end, a tile's completion
    (two for n = 70 at G 64), and in an empty sequence. Bit for bit needs the same kernel path: the tiles
    are split 9 ways (the merge kernel's path, which no launch size changes; the direct path's cluster and
    warp-pair choices depend on the launch's size, and a step's launch has n times the rows)."""
    G = kvarn.PRESETS[preset].group
    hk, hq = 2, 2 * gqa
    lengths = [0, G - 3, 2 * G - 5, 10 * G + 1]  # sink = G: tiles complete at 2G, 3G, ...; the longest has 9
    seed = _seed("step", preset, head_dim, gqa, n)
    step, ids, _ = prefilled(preset, head_dim, hk, lengths, seed)
    ref, ref_ids, _ = prefilled(preset, head_dim, hk, lengths, seed)
    for c in (step, ref):
        force_splits(c, 12)  # 9 tiles: 9 splits of one
    q, k, v = step_inputs(seed + 1, len(ids), n, hq, hk, head_dim)
    got = step.append_attend(dev(q), ids, dev(k), dev(v)).cpu().numpy()
    assert got.shape == (len(ids), n, hq, head_dim)
    for i in range(n):
        ref.append(ref_ids, dev(k[:, i]), dev(v[:, i]))
        want = ref.attend(dev(q[:, i]), ref_ids).cpu().numpy()
        np.testing.assert_array_equal(got[:, i], want, err_msg=f"token {i}")
    for sid, rid in zip(ids, ref_ids):
        assert content(step, sid) == content(ref, rid)


@gpu
@need_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("gqa,splits", [(4, None), (4, 2), (4, 3), (8, 2), (1, None)])
def test_step_against_the_oracle(dtype, gqa, splits):
    """q/k/v in each input dtype, the heuristic's splits or forced ones (the direct path's clusters, warp
    pairs where they fit, bf16/fp16 q by vector loads): every token of every sequence within test_cuda's
    bound of float64 attention over what the cache held after that token (a CPU cache of the same fp16
    tokens)."""
    preset, D, hk, n = "k4v2_g128", 128, 2, 12
    lengths = [5, 250, 1000]
    seed = _seed("step-oracle", dtype, gqa, splits)
    cache, ids, host = prefilled(preset, D, hk, lengths, seed)
    if splits:
        force_splits(cache, splits)
    q, k, v = step_inputs(seed + 1, len(ids), n, hk * gqa, hk, D)
    tq, tk, tv = (dev(x, getattr(torch, dtype)) for x in (q, k, v))
    # float32 out (kernels write out's dtype): a bf16 / fp16 out would add its own rounding, 4e-3 / 5e-4
    out32 = torch.empty(tq.shape, dtype=torch.float32, device="cuda")
    assert cache.append_attend(tq, ids, tk, tv, out=out32) is out32
    out = out32.cpu().numpy()
    q32, k16, v16 = (x.float().cpu().numpy() for x in (tq, tk, tv))  # as the kernels read them
    for b in range(len(ids)):
        cpu = kvarn.KVCache(hk, D, preset, sink_tokens=cache.sink_tokens)
        cpu.append(*host[b])
        for i in range(n):
            cpu.append(k16[b, i][:, None].astype(np.float16), v16[b, i][:, None].astype(np.float16))
            check_against_cpu(cpu, q32[b, i], out[b, i], 1 / np.sqrt(D), (b, i))


@gpu
@need_torch
def test_step_inputs_of_every_kind_and_unvalidated():
    """DeviceArray (CUDA Array Interface) inputs give the torch inputs' outputs; out= is written in place;
    validate=False gives the same bytes; a step of no tokens changes nothing."""
    preset, D, hk, hq, n = "k4v2_g128", 128, 2, 8, 5
    lengths = [120, 254]
    seed = _seed("step-kinds")
    q, k, v = step_inputs(seed + 1, len(lengths), n, hq, hk, D)
    outs = []
    for kind in ("torch", "cai", "out", "unvalidated"):
        cache, ids, _ = prefilled(preset, D, hk, lengths, seed)
        if kind == "cai":
            o = cache.append_attend(kc.DeviceArray.from_numpy(q), ids, kc.DeviceArray.from_numpy(k),
                                    kc.DeviceArray.from_numpy(v))
            assert isinstance(o, kc.DeviceArray)
            outs.append(o.to_numpy())
        elif kind == "out":
            buf = torch.full((len(ids), n, hq, D), float("nan"), device="cuda")
            assert cache.append_attend(dev(q), ids, dev(k), dev(v), out=buf) is buf
            outs.append(buf.cpu().numpy())
        else:
            outs.append(cache.append_attend(dev(q), ids, dev(k), dev(v),
                                            validate=kind != "unvalidated").cpu().numpy())
        assert [cache.length(s) for s in ids] == [x + n for x in lengths]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    # by default the output takes q's dtype and library
    cache, ids, _ = prefilled(preset, D, hk, lengths, seed)
    bf = cache.append_attend(dev(q, torch.bfloat16), ids, dev(k), dev(v))
    assert bf.dtype == torch.bfloat16 and tuple(bf.shape) == (len(ids), n, hq, D)
    empty = cache.append_attend(dev(q[:, :0]), ids, dev(k[:, :0]), dev(v[:, :0]))
    assert tuple(empty.shape) == (len(ids), 0, hq, D) and [cache.length(s) for s in ids] == [x + n for x in lengths]


@gpu
@need_torch
def test_step_refused_by_a_late_store_leaves_the_cache_as_it_was():
    """Sequence a completes a tile at the step's 3rd token, b (its tail empty) at its 128th, with keys the
    store flags (decoding beyond the norm the q check assumes): the step raises and both sequences hold
    the bytes they held before, a's consumed tail included (restored from its copy). The same step with b's
    keys fine then runs, and equals a fresh cache's."""
    D, hk, hq, n = 64, 1, 4, 130
    G = 128
    lengths = [2 * G - 3, G]  # sink G: a completes at token 2 of the step, b at token 127 (all step tokens)
    seed = _seed("step-late-store")
    cache, ids, _ = prefilled("k4v2_g128", D, hk, lengths, seed, sink=G)
    q, k, v = step_inputs(seed + 1, 2, n, hq, hk, D)
    bad_k = k.copy()
    bad_k[1, :G, 0, :] = _spiky_keys(12, D=D)[0]  # test_cuda: this tile's keys decode beyond the bound
    before = [content(cache, s) for s in ids], cache.free_pages
    with pytest.raises(ValueError, match="^k: a tile's keys decode to norms beyond sqrt"):
        cache.append_attend(dev(q), ids, dev(bad_k), dev(v))
    assert ([content(cache, s) for s in ids], cache.free_pages) == before
    got = cache.append_attend(dev(q), ids, dev(k), dev(v)).cpu().numpy()
    fresh, fresh_ids, _ = prefilled("k4v2_g128", D, hk, lengths, seed, sink=G)
    want = fresh.append_attend(dev(q), fresh_ids, dev(k), dev(v)).cpu().numpy()
    np.testing.assert_array_equal(got, want)
    assert [content(cache, s) for s in ids] == [content(fresh, s) for s in fresh_ids]


@gpu
@need_torch
def test_step_refusals_on_the_gpu():
    """NaN / Inf in q, k or v, a q whose scores could overflow: refused before anything changes."""
    D, hk, hq, n = 128, 2, 8, 6
    lengths = [250, 3]
    seed = _seed("step-refusals")
    cache, ids, _ = prefilled("k4v2_g128", D, hk, lengths, seed)
    before = [content(cache, s) for s in ids], cache.free_pages
    q, k, v = step_inputs(seed + 1, 2, n, hq, hk, D)
    for name, value, match in (("q", np.nan, "^q: contains NaN or Inf"), ("k", np.inf, "^k: contains NaN or Inf"),
                               ("v", np.nan, "^v: contains NaN or Inf"), ("v", 1e6, "^v: values beyond the fp16"),
                               ("q", 1e33, "^q: max |q| x |scale|")):
        x = {"q": q, "k": k, "v": v}
        x = {key: val.copy() for key, val in x.items()}
        x[name][1, n - 1, 0, 5] = value
        with pytest.raises(ValueError, match=match.replace("|", r"\|")):
            cache.append_attend(dev(x["q"]), ids, dev(x["k"]), dev(x["v"]))
        assert ([content(cache, s) for s in ids], cache.free_pages) == before


# ---- the host side, on FakeCuda (no GPU) -----------------------------------------------------------------
def _launches(fake, monkeypatch):
    """Records each attend launch: (rows, meta [rows][4], q spec, out spec)."""
    got = []

    def attend(desc, layer, meta, meta_bytes, batch, q, hq, scale, out, *rest):
        buf, off = fake._find(meta, 16 * batch)
        got.append((batch, buf[off:off + 16 * batch].view(np.int32).reshape(batch, 4).copy(), q, out))
        fake.calls.append("attend")
        return 0

    monkeypatch.setattr(fake, "attend", attend)
    return got


def _nine_token_step(fake, seed):
    """A cache of a (250 tokens) and b (empty), and a 9-token step's q, k, v for both."""
    rng = np.random.default_rng(_seed(seed))
    cache = kc.PagedKVCache(2, 128, max_seqs=2, max_seq_len=1024)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append([a], FakeDevArray(fake, kv_like(rng, (1, 250, 2, 128))), FakeDevArray(fake, kv_like(rng, (1, 250, 2, 128))))
    q = FakeDevArray(fake, kv_like(rng, (2, 9, 8, 128)))
    k, v = (FakeDevArray(fake, kv_like(rng, (2, 9, 2, 128))) for _ in range(2))
    return cache, a, b, q, k, v


def test_fake_step_runs_in_chunks_that_complete_no_tile(fake, monkeypatch):
    """a (250 tokens, sink 128, G 128) completes its first tile at the step's 6th token; b (empty) starts in
    the sink. A 9-token step runs as tokens 0-4 (one launch of 2 x 5 rows), 5 alone (a's store before it),
    6-8; each row's metadata is its token's own lengths, and each launch reads q and writes out at its
    tokens."""
    launches = _launches(fake, monkeypatch)
    cache, a, b, q, k, v = _nine_token_step(fake, "fake-step")
    fake.calls.clear()
    out = cache.append_attend(q, [a, b], k, v)
    assert fake.calls == ["check"] * 3 + ["write_tokens", "attend", "store", "write_tokens", "attend",
                                          "write_tokens", "attend"]
    assert [x[0] for x in launches] == [10, 2, 6]
    rows = np.concatenate([x[1] for x in launches])
    # (slot, tiles, sink_len, tail_len) per row, sequence-major within a launch
    want = ([[a, 0, 128, L - 128] for L in range(251, 256)] + [[b, 0, L, 0] for L in range(1, 6)] +
            [[a, 1, 128, 0], [b, 0, 6, 0]] +
            [[a, 1, 128, L - 256] for L in range(257, 260)] + [[b, 0, L, 0] for L in range(7, 10)])
    assert rows.tolist() == want
    item = 4  # float32
    for (_, _, qs, os_), pos, m in zip(launches, (0, 5, 6), (5, 1, 3)):
        assert qs == (q.ptr + pos * 8 * 128 * item, 0, (2, m, 8, 128), (9 * 8 * 128, 8 * 128, 128, 1))
        assert os_[0] == kc._ptr(out) + pos * 8 * 128 * item and os_[2] == (2, m, 8, 128)
    assert (cache.length(a), cache.length(b), len(cache._pages[a]), len(cache._pages[b])) == (259, 9, 1, 0)


def test_fake_step_refusals_queue_nothing(fake):
    rng = np.random.default_rng(_seed("fake-step-refusals"))
    cache = kc.PagedKVCache(2, 128, max_seqs=2, max_seq_len=300, num_pages=1)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append([a], FakeDevArray(fake, kv_like(rng, (1, 250, 2, 128))), FakeDevArray(fake, kv_like(rng, (1, 250, 2, 128))))
    cache.append([b], FakeDevArray(fake, kv_like(rng, (1, 200, 2, 128))), FakeDevArray(fake, kv_like(rng, (1, 200, 2, 128))))

    def arr(*shape):
        return FakeDevArray(fake, kv_like(rng, shape))

    q, k = arr(2, 4, 8, 128), arr(2, 4, 2, 128)
    cases = [
        (dict(q=arr(2, 8, 128)), ValueError, r"^q: expected a 4-D array \[B, n, Hq, D\], got shape \(2, 8, 128\)"),
        (dict(q=arr(1, 4, 8, 128)), ValueError, "^q: batch of 1 queries for 2 sequences"),
        (dict(q=arr(2, 4, 5, 128)), ValueError, "^q: 5 query heads is not a positive multiple"),
        (dict(k=arr(2, 3, 2, 128), v=arr(2, 3, 2, 128)), ValueError, "^k: 3 tokens per sequence for q's 4"),
        (dict(k=arr(2, 4, 128)), ValueError, r"^k: expected shape \[B, T, 2, 128\], got"),
        (dict(v=arr(2, 4, 2, 64)), ValueError, r"^v: expected shape"),
        (dict(out=arr(2, 4, 8, 64)), ValueError, r"^out: expected shape \(2, 4, 8, 128\)"),
        (dict(out=k), ValueError, "^out: expected shape"),
        (dict(out=FakeDevArray(fake, np.zeros((2, 4, 8, 128), np.float32), ptr=q.ptr)), ValueError, "^out: overlaps q"),
        (dict(scale=float("nan")), ValueError, "^scale"),
        (dict(seq_ids=[a, a]), ValueError, "^seq_ids: a sequence appears twice"),
        (dict(layer=1), ValueError, r"^layer: 1 is outside \[0, 1\)"),
    ]
    for kw, error, match in cases:
        args = dict(q=q, seq_ids=[a, b], k=k, v=k)
        args.update(kw)
        fake.calls.clear()
        with pytest.raises(error, match=match):
            cache.append_attend(args.pop("q"), args.pop("seq_ids"), args.pop("k"), args.pop("v"), **args)
        assert fake.calls == [], (match, fake.calls)
    # Past max_seq_len (a: 250 + 51 > 300), and out of pages (the pool's one page is a's: b's step to 256
    # needs another): refused on the host, before any kernel.
    with pytest.raises(ValueError, match=f"^k: sequence {a} would hold 301 tokens"):
        cache.append_attend(arr(2, 51, 8, 128), [a, b], arr(2, 51, 2, 128), arr(2, 51, 2, 128))
    cache.append_attend(arr(2, 6, 8, 128), [a, b], arr(2, 6, 2, 128), arr(2, 6, 2, 128))  # a completes: the page
    assert (cache.length(a), cache.length(b), cache.free_pages) == (256, 206, 0)
    fake.calls.clear()
    with pytest.raises(RuntimeError, match="out of pages"):
        cache.append_attend(arr(1, 50, 8, 128), [b], arr(1, 50, 2, 128), arr(1, 50, 2, 128))
    assert fake.calls == [] and cache.length(b) == 206
    # Flags the checking kernel raises: q's (its own bits), then k's and v's, before any append.
    for bits, match in ((lambda nf, r: nf if nf == kc._Q_NONFINITE else 0, "^q: contains NaN or Inf"),
                        (lambda nf, r: nf if nf == fake.FLAG_K_NONFINITE else 0, "^k: contains NaN or Inf"),
                        (lambda nf, r: r if r == fake.FLAG_V_RANGE else 0, "^v: values beyond the fp16 range")):
        fake.flags_on_check = bits
        fake.calls.clear()
        with pytest.raises(ValueError, match=match):
            cache.append_attend(q, [a, b], k, k)
        assert fake.calls == ["check"] * 3 and (cache.length(a), cache.length(b)) == (256, 206)
    # A one-token step (the decode path, _decode_rows) of a full sequence: refused the same way, a alone or beside b.
    fake.flags_on_check = staticmethod(lambda nonfinite, out_of_range: 0)
    cache.append([a], arr(1, 44, 2, 128), arr(1, 44, 2, 128))
    flags = FakeDevArray(fake, np.zeros(1, np.int32))
    for rows in ([a], [b, a]):
        fake.calls.clear()
        with pytest.raises(ValueError, match=f"^k: sequence {a} would hold 301 tokens"):
            cache.append_attend(arr(len(rows), 1, 8, 128), rows, arr(len(rows), 1, 2, 128), arr(len(rows), 1, 2, 128),
                                validate=False, flags=flags)
        assert fake.calls == [] and (cache.length(a), cache.length(b)) == (300, 206)


def test_fake_step_with_deferred_flags(fake, monkeypatch):
    """append_attend(validate=False, flags=f): the checking kernels and the store kernel OR their bits into f, and
    nothing waits or refuses: the step lands (lengths, launches as validated), f holds the bits, and flags_error
    names what validate=True would have raised. Bad flags, or flags with validate=True, are refused first."""
    _launches(fake, monkeypatch)
    cache, a, b, q, k, v = _nine_token_step(fake, "fake-step-flags")
    flags = FakeDevArray(fake, np.zeros(1, np.int32))
    for bad, error, match in ((FakeDevArray(fake, np.zeros(1, np.float32)), TypeError, "^flags: expected a contiguous int32"),
                              (FakeDevArray(fake, np.zeros(1, np.int32), readonly=True), ValueError, "^flags: the array is read-only")):
        fake.calls.clear()
        with pytest.raises(error, match=match):
            cache.append_attend(q, [a, b], k, v, validate=False, flags=bad)
        assert fake.calls == []
    with pytest.raises(ValueError, match="^flags: the checks that write them do not wait or refuse; pass validate=False"):
        cache.append_attend(q, [a, b], k, v, flags=flags)
    fake.flags_on_check = lambda nf, r: nf if nf == fake.FLAG_K_NONFINITE else 0
    fake.flags_on_store = fake.FLAG_KEY_NORM
    fake.calls.clear()
    cache.append_attend(q, [a, b], k, v, validate=False, flags=flags)
    assert fake.calls == ["check"] * 3 + ["write_tokens", "attend", "store", "write_tokens", "attend",
                                          "write_tokens", "attend"]
    assert (cache.length(a), cache.length(b)) == (259, 9)  # landed
    bits = int(fake._find(flags.ptr, 4)[0][:4].view(np.int32)[0])
    assert bits == fake.FLAG_K_NONFINITE | fake.FLAG_KEY_NORM
    assert str(kc.flags_error(bits)) == "k: contains NaN or Inf"
    assert str(kc.flags_error(fake.FLAG_KEY_NORM)).startswith("k: a tile's keys decode to norms beyond")
    assert str(kc.flags_error(kc._Q_RANGE | fake.FLAG_V_NONFINITE, query="query")).startswith(
        "query: values beyond the fp16 range (|x| > 65504), which deferred checks refuse")
    assert kc.flags_error(0) is None


def test_fake_decode_step_host_work(fake, monkeypatch):
    """A deferred one-token step (KVarNCache's per layer) queues one check launch for q, k and v, one upload of
    the append's and the attend's metadata together, write_tokens and attend, and no stream wait; where its token
    completes a tile, the store too, still in one upload. The attend reads its rows from that upload."""
    launches = _launches(fake, monkeypatch)
    many = []
    monkeypatch.setattr(fake, "check_many", lambda specs, bits, flag, stream: many.append(len(specs)) or 0)
    fake.log_copies = True
    rng = np.random.default_rng(_seed("fake-decode-host"))
    cache = kc.PagedKVCache(2, 128, max_seqs=2, max_seq_len=1024)
    a, b = cache.add_sequence(), cache.add_sequence()
    for seq, n in ((a, 254), (b, 100)):
        cache.append([seq], FakeDevArray(fake, kv_like(rng, (1, n, 2, 128))), FakeDevArray(fake, kv_like(rng, (1, n, 2, 128))))
    flags = FakeDevArray(fake, np.zeros(1, np.int32))
    many.clear()
    # (slot, tiles, sink_len, tail_len) of a's and b's rows: a's 256th token completes its first tile
    for step, (want_calls, want_rows) in enumerate(((["write_tokens", "attend"], [[a, 0, 128, 127], [b, 0, 101, 0]]),
                                                    (["store", "write_tokens", "attend"], [[a, 1, 128, 0], [b, 0, 102, 0]]))):
        q = FakeDevArray(fake, kv_like(rng, (2, 1, 8, 128)))
        k, v = (FakeDevArray(fake, kv_like(rng, (2, 1, 2, 128))) for _ in range(2))
        fake.calls.clear()
        fake.stream_ops.clear()
        cache.append_attend(q, [a, b], k, v, validate=False, flags=flags)
        assert many == [3] * (step + 1) and fake.calls == want_calls
        assert [op[0] for op in fake.stream_ops] == ["memcpy_htod", "record"]
        assert launches[-1][1].tolist() == want_rows


@pytest.mark.parametrize("preset,sink,hq", [("k4v2_g128", None, 8), ("k4v4_g64", 0, 2), ("k4v2_g64", 64, 4)])
def test_fake_decode_path_queues_what_the_general_path_queues(fake, monkeypatch, preset, sink, hq):
    """One-token steps of up to _DECODE_ROWS rows work out their metadata in Python ints (_decode_rows): over steps
    that fill the sink, complete tiles (those take the general path) and run on, with rows of different lengths and
    batches of 1 to 3, every launch (the uploaded write_tokens and attend rows, the splits, the query rows) and the
    lengths after each step equal the general path's (_DECODE_ROWS = 0)."""
    def run(decode_rows):
        monkeypatch.setattr(kc, "_DECODE_ROWS", decode_rows)
        log = []

        def write_tokens(desc, layer, k, v, meta, meta_bytes, B, flag, stream):
            buf, off = fake._find(meta, 12 * B)
            log.append(("write", layer, k[2], buf[off:off + 12 * B].view(np.int32).tolist(), flag == never))
            return 0

        def attend(desc, layer, meta, meta_bytes, rows, q, hq_, scale, out, scratch, scratch_bytes, splits, tps,
                   q_rows, stream):
            buf, off = fake._find(meta, 16 * rows)
            log.append(("attend", layer, rows, buf[off:off + 16 * rows].view(np.int32).tolist(), q[2], hq_, scale,
                        splits, tps, q_rows))
            return 0

        monkeypatch.setattr(fake, "write_tokens", write_tokens)
        monkeypatch.setattr(fake, "attend", attend)
        monkeypatch.setattr(fake, "store", lambda *a: log.append(("store", a[5])) or 0)
        rng = np.random.default_rng(_seed("fake-decode-path"))
        cache = kc.PagedKVCache(2, 64, preset, num_layers=2, max_seqs=3, max_seq_len=1024, sink_tokens=sink)
        never = cache._never_set.ptr
        ids = [cache.add_sequence() for _ in range(3)]
        for layer in range(2):
            for sid, n in zip(ids, (0, 200, 250)):
                if n:
                    cache.append([sid], FakeDevArray(fake, kv_like(rng, (1, n, 2, 64))),
                                 FakeDevArray(fake, kv_like(rng, (1, n, 2, 64))), layer=layer)
        flags = FakeDevArray(fake, np.zeros(1, np.int32))
        lengths, storing = [], 0  # storing: steps that completed a tile
        for step in range(200):
            before = len(log)
            rows = ids if step % 4 == 0 else ids[step % 3 : step % 3 + 1 + step % 2]  # batches of 3, 1 and 2
            q = FakeDevArray(fake, kv_like(rng, (len(rows), 1, hq, 64)))
            k, v = (FakeDevArray(fake, kv_like(rng, (len(rows), 1, 2, 64))) for _ in range(2))
            cache.append_attend(q, rows, k, v, layer=step % 2, validate=step % 5 == 0,
                                flags=None if step % 5 == 0 else flags)
            lengths.append(cache._lengths.tolist())
            storing += any(entry[0] == "store" for entry in log[before:])
        return log, lengths, storing

    taken = []
    decode_step = kc.PagedKVCache._decode_step
    monkeypatch.setattr(kc.PagedKVCache, "_decode_step", lambda self, *a: taken.append(1) or decode_step(self, *a))
    decode_log, decode_lengths, storing = run(kc._DECODE_ROWS)
    assert storing >= 4 and len(taken) == 200 - storing  # every step but those that complete a tile
    general_log, general_lengths, _ = run(0)
    assert len(taken) == 200 - storing
    assert decode_lengths == general_lengths
    assert decode_log == general_log


def test_fake_step_refused_late_is_undone(fake, monkeypatch):
    """a (250 tokens) completes a tile at the step's 6th token, b (200) at its 56th, and the store flags b's
    tile: the step raises, and lengths, pages and both tails are as before the step, a's consumed tail
    restored from the copy made before (b's was never reused: a flagged store stops write_tokens). Only
    the tails a later refusal could need are copied: a's, not b's."""
    rng = np.random.default_rng(_seed("fake-step-undo"))
    cache = kc.PagedKVCache(2, 128, max_seqs=2, max_seq_len=1024)
    a, b = cache.add_sequence(), cache.add_sequence()
    for s, n0 in ((a, 250), (b, 200)):
        cache.append([s], FakeDevArray(fake, kv_like(rng, (1, n0, 2, 128))), FakeDevArray(fake, kv_like(rng, (1, n0, 2, 128))))
    tails = [fake._find(t.ptr, t.nbytes)[0] for t in (cache._tail_k, cache._tail_v)]
    for t in tails:  # what the tails held (the fake write_tokens wrote nothing so far)
        t[:] = rng.integers(0, 256, t.size, dtype=np.uint8)
    before_tails = [t.copy() for t in tails]

    def write_tokens(desc, layer, k, v, meta, meta_bytes, B, flag, stream):
        """As the kernel: nothing if flagged, else each token at or past the first tail position into its tail row."""
        fake.calls.append("write_tokens")
        buf, off = fake._find(flag, 4)
        if buf[off:off + 4].view(np.int32)[0]:
            return 0
        buf, off = fake._find(meta, 12 * B)
        for slot, before, first_tail in buf[off:off + 12 * B].view(np.int32).reshape(B, 3).tolist():
            for t in range(k[2][1]):
                if before + t >= first_tail:
                    for tail in tails:
                        tail.reshape(1, 2, 2, 128, 128 * 2)[layer, slot, :, before + t - first_tail] = 0xEE
        return 0

    stores = []

    def store(*args):
        fake.calls.append("store")
        stores.append(args)
        if len(stores) == 2:  # b's tile
            buf, off = fake._find(args[-2], 4)
            buf[off:off + 4].view(np.int32)[0] |= fake.FLAG_KEY_NORM
        return 0

    dtod = []
    real_dtod = fake.memcpy_dtod
    monkeypatch.setattr(fake, "memcpy_dtod", lambda d, s, n, st: dtod.append((d, s, n)) or real_dtod(d, s, n, st))
    monkeypatch.setattr(fake, "write_tokens", write_tokens)
    monkeypatch.setattr(fake, "store", store)
    pages_before, free_before = [list(cache._pages[s]) for s in (a, b)], cache.free_pages
    q = FakeDevArray(fake, kv_like(rng, (2, 60, 8, 128)))
    k, v = (FakeDevArray(fake, kv_like(rng, (2, 60, 2, 128))) for _ in range(2))
    with pytest.raises(ValueError, match="^k: a tile's keys decode to norms beyond sqrt"):
        cache.append_attend(q, [a, b], k, v)
    assert len(stores) == 2
    # a's 122 tail rows of each head, k then v, copied out, then back; nothing of b's
    head_bytes = 128 * 128 * 2
    rows = [(tail.ptr + (a * 2 + h) * head_bytes, 122 * 128 * 2) for tail in (cache._tail_k, cache._tail_v)
            for h in range(2)]
    assert [(s, n) for _, s, n in dtod[:4]] == rows
    assert len(dtod) == 8 and [(d, s, n) for d, s, n in dtod[4:]] == [(s, d, n) for d, s, n in dtod[:4]]
    assert (cache.length(a), cache.length(b)) == (250, 200)
    assert [list(cache._pages[s]) for s in (a, b)] == pages_before and cache.free_pages == free_before
    for t, t0 in zip(tails, before_tails):
        for s, n_tail in ((a, 250 - 128 - 0), (b, 200 - 128)):
            rows = t.reshape(2, 2, 128, 256)[s, :, :n_tail]
            np.testing.assert_array_equal(rows, t0.reshape(2, 2, 128, 256)[s, :, :n_tail])
