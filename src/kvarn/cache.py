"""KVCache: one sequence's keys and values for all kv-heads of one layer.

Token order is sink | quantised tiles | tail (SPEC §7):
- the first ``sink_tokens`` tokens stay in fp16 for the life of the sequence;
- after them, every run of ``group`` tokens becomes one quantised tile (one
  SPEC §6 record per kv-head) the moment it is complete;
- the unfinished last tile (the tail) stays in fp16.
Full-precision parts are stored as float16, the precision of an fp16 engine's
cache; inputs beyond the fp16 range are rejected.
"""
from __future__ import annotations

import copy
import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ._ops import (
    DEFAULT_PRESET,
    PRESETS,
    SINKHORN_ITERS,
    as_float_array,
    check_head_dim,
    check_iters,
    check_kv,
    check_positive_int,
    check_tokens_f16,
    get_preset,
    plain_tokens,
    quantize_tiles_native,
    resolve_threads,
    store_tokens,
    tile_cut_point,
)
from . import _ops

if TYPE_CHECKING:  # annotations only
    from numpy.typing import ArrayLike

    from ._ops import Preset, PresetLike


QUANTIZE_ON = ("fill", "next")


def _refs(holder, i: int) -> int:
    # sys.getrefcount of holder[i], read through a subscript (a new reference on every CPython;
    # a local variable's may be borrowed, as 3.14 does), so that its offset is fixed.
    return sys.getrefcount(holder[i])


# Whether reference counts say who holds a buffer: CPython's, with the GIL ordering them. Elsewhere
# (PyPy, a free-threaded build) shared tail buffers are always copied before a write.
_REFCOUNTS_EXACT = sys.implementation.name == "cpython" and getattr(sys, "_is_gil_enabled", lambda: True)()


class KVCache:
    """A KVarN-compressed KV cache for ``num_kv_heads`` heads of ``head_dim`` channels.

    quantize_on="fill" (default, SPEC §7) quantises a tile the moment its last token is appended,
    so that token already attends to its own tile quantised. quantize_on="next" keeps a full tail
    exact until the next append, so every token attends to its whole own tile exact (the rule the
    accuracy evaluation's pseudo-decode uses). It quantises the tile when it fills all the same (so
    the append that fills a tile that cannot be quantised is refused, as with "fill") and keeps
    those records aside until the next append publishes them: one tile's records of memory.

    Threads: a cache may be shared. Appends, truncate and rollback are serialised by its lock; attend,
    copy, to_parts and pickling read one published state, never a mix (README, "Threads").
    """

    def __init__(
        self,
        num_kv_heads: int,
        head_dim: int,
        preset: PresetLike = DEFAULT_PRESET,
        sink_tokens: int | None = None,
        *,
        iters: int = SINKHORN_ITERS,
        quantize_on: str = "fill",
    ) -> None:
        self._num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        _ops.check_choice(quantize_on, "quantize_on", QUANTIZE_ON, "mode")
        self._quantize_on = quantize_on
        self._head_dim = check_head_dim(head_dim)
        self._preset = get_preset(preset)
        self._sink_tokens = self.preset.group if sink_tokens is None else check_positive_int(sink_tokens, "sink_tokens", 0)
        self._iters = check_iters(iters)
        self._record_bytes = self.preset.record_bytes(self.head_dim)
        H, G, D = self.num_kv_heads, self.preset.group, self.head_dim
        empty = np.zeros((H, 0, D), np.float16)
        # A records buffer a rollback made current again: newer states (checkpoints, or an attend in
        # flight) may hold content past the restored tile count in it, so the next write copies it first.
        self._frozen_records = None
        # [tail_k, tail_v] of the current state that other states may read past its tail_len: newer ones
        # after a rollback, older ones after a completed tile handed the pair on (see _append). The next
        # write copies them first, unless nothing else holds them any more (_settle_frozen_tail).
        self._frozen_tail = None
        # The records buffer published last and the most tiles any state has published in it: a
        # rollback within that count leaves the buffer writable (no state reads past it).
        self._records_seen, self._records_high_water = None, 0
        self._publish(
            empty, empty,
            np.zeros((0, H, self._record_bytes), np.uint8),  # records [capacity, H, bytes]
            0,
            np.zeros((H, G, D), np.float16), np.zeros((H, G, D), np.float16),  # tail [H, G, D]
            0,
        )
        # Serialises appends (the native quantiser runs without the GIL). attend() needs no lock:
        # it reads a snapshot, and append only writes records past that snapshot's tile count.
        self._append_lock = _ops.new_append_lock(self)

    # ---- settings --------------------------------------------------------------
    # Read-only, as Tile's: every append and attend sizes its buffers and native reads from them, so
    # an assignment would make later calls drop or repeat tokens. Other settings need a new cache.
    @property
    def num_kv_heads(self) -> int:
        """KV heads (fixed at construction)."""
        return self._num_kv_heads

    @property
    def head_dim(self) -> int:
        """Channels per token (fixed at construction)."""
        return self._head_dim

    @property
    def preset(self) -> Preset:
        """The quantisation format, a kvarn.Preset (fixed at construction)."""
        return self._preset

    @property
    def sink_tokens(self) -> int:
        """Tokens kept in the fp16 sink (fixed at construction)."""
        return self._sink_tokens

    @property
    def iters(self) -> int:
        """Balancing iterations per tile (fixed at construction)."""
        return self._iters

    @property
    def quantize_on(self) -> str:
        """"fill" or "next" (fixed at construction; class docstring)."""
        return self._quantize_on

    # ---- state ---------------------------------------------------------------
    _sink_k = property(lambda self: self._state[0])
    _sink_v = property(lambda self: self._state[1])
    _records = property(lambda self: self._state[2])
    _num_tiles = property(lambda self: self._state[3])
    _tail_k = property(lambda self: self._state[4])
    _tail_v = property(lambda self: self._state[5])
    _tail_len = property(lambda self: self._state[6])

    # ---- sizes ---------------------------------------------------------------
    # Each reads one snapshot of the state: another thread may append meanwhile.
    def _sizes(self, state=None) -> tuple:
        """(sink_len, num_tiles, tail_len) of the current state (or of the given one)."""
        sink_k, _, _, num_tiles, _, _, tail_len = self._state if state is None else state
        return sink_k.shape[1], num_tiles, tail_len

    def _length(self, state=None) -> int:
        sink_len, num_tiles, tail_len = self._sizes(state)
        return sink_len + num_tiles * self.preset.group + tail_len

    @property
    def sink_len(self) -> int:
        """Tokens in the fp16 sink (the first sink_tokens)."""
        return self._sink_k.shape[1]

    @property
    def num_tiles(self) -> int:
        """Quantised tiles (records per kv head)."""
        return self._num_tiles

    @property
    def tail_len(self) -> int:
        """Tokens in the fp16 tail (the unfinished tile)."""
        return self._tail_len

    def __len__(self) -> int:
        return self._length()

    def _nbytes(self, sink_len, num_tiles, tail_len) -> int:
        fp16_token_bytes = 2 * 2 * self.num_kv_heads * self.head_dim  # K and V
        return (sink_len + tail_len) * fp16_token_bytes + num_tiles * self.num_kv_heads * self._record_bytes

    def _ratio(self, sink_len, num_tiles, tail_len) -> float:
        n = sink_len + num_tiles * self.preset.group + tail_len
        return n * 2 * 2 * self.num_kv_heads * self.head_dim / self._nbytes(sink_len, num_tiles, tail_len) if n else 1.0

    @property
    def nbytes(self) -> int:
        """Bytes holding the cached tokens: fp16 sink and tail, plus packed tile records."""
        return self._nbytes(*self._sizes())

    @property
    def allocated_nbytes(self) -> int:
        """Bytes of the buffers this cache holds now: nbytes plus the tail buffer's free slots (it
        always holds one tile) and the record buffer's spare capacity (it grows by a quarter)."""
        sink_k, sink_v, records, _, tail_k, tail_v, _ = self._state  # one snapshot
        return sink_k.nbytes + sink_v.nbytes + records.nbytes + tail_k.nbytes + tail_v.nbytes

    @property
    def compression_ratio(self) -> float:
        """fp16 cache bytes of the same tokens / nbytes (1.0 for an empty cache)."""
        return self._ratio(*self._sizes())

    @property
    def records(self) -> np.ndarray:
        """The quantised tiles' records, uint8 [num_tiles, num_kv_heads, record_bytes] (a read-only
        view that cannot be made writeable: attention trusts what append or from_parts checked)."""
        state = self._state
        return _ops.read_only(state[2])[: state[3]]

    # ---- append --------------------------------------------------------------
    def append(self, k: ArrayLike, v: ArrayLike, *, num_threads: int | None = None) -> None:
        """Appends n tokens: k, v of shape [num_kv_heads, n, head_dim], float16, bfloat16, float32 or
        float64 (either byte order), stored and quantised as their fp16 rounding.

        Validates everything and quantises completed tiles before changing any
        state, so a rejected append leaves the cache exactly as it was.
        """
        with self._append_lock:
            self._append_locked(k, v, num_threads)

    def _append_locked(self, k, v, num_threads) -> None:  # append's work; the caller holds the append lock
        H, G, D = self.num_kv_heads, self.preset.group, self.head_dim
        # float32 or float16 tokens (a model's K/V) that only go into the tail are checked and stored as fp16
        # in one native pass per tensor, below; anything else is checked by check_kv first.
        checked_on_store = plain_tokens(k, v, H, D)
        if not checked_on_store:
            k, v = check_kv(k, v, H, D)
        threads = resolve_threads(num_threads)
        n = k.shape[1]
        if n == 0:
            return
        self._settle_frozen_tail()
        state = self._state
        sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len = state
        to_sink = min(n, self.sink_tokens - sink_k.shape[1])
        rest = tail_len + n - to_sink
        # "next": a complete tile waits in the tail until a later token arrives.
        n_full = rest // G if self.quantize_on == "fill" else max(0, rest - 1) // G
        if to_sink == 0 and rest <= G:
            # The common decode step: the tokens go into the tail buffer in place, past tail_len,
            # where no published state reads (as new records go past num_tiles; a frozen pair, which
            # other states may read there, is copied first), so a concurrent
            # attend keeps its snapshot; copying the whole tail per token was O(group) per step.
            # Tail buffers are never shared between caches (copy() - also behind copy.copy/deepcopy -,
            # truncate and from_parts make fresh ones). Tokens refused there leave bytes past tail_len
            # only, which nothing reads.
            tail_k, tail_v = self._writable_tail(tail_k, tail_v)
            store_tokens(k, v, tail_k[:, tail_len:rest], tail_v[:, tail_len:rest], checked_on_store)
            if n_full:
                # quantize_on="fill" and the tail is now a whole tile: quantised from the tail buffer
                # itself into the records past num_tiles (may raise: nothing published), which then
                # hands the buffer on, frozen, to a state whose tail is empty (see below).
                records = self._records_with_room(records, num_tiles, num_tiles + 1)
                self._quantize_tail_tile(tail_k, tail_v, num_tiles, threads, out=records[num_tiles])
                self._commit(sink_k, sink_v, records, num_tiles + 1, tail_k, tail_v, 0, reuse_tail=True)
                return
            staged = self._stage_full_tail(tail_k, tail_v, rest, num_tiles, threads)  # may raise: nothing published
            self._commit(sink_k, sink_v, records, num_tiles, tail_k, tail_v, rest, reuse_tail=False, staged=staged)
            return
        if checked_on_store:  # not stored above: their values checked here (plain_tokens checked the rest)
            check_tokens_f16(k, "k")
            check_tokens_f16(v, "v")
        # 1. What goes to the sink.
        new_sink_k = new_sink_v = None
        if to_sink > 0:
            # Fresh C-order buffers, filled by assignment (the same fp16 rounding as astype): np.concatenate
            # keeps its inputs' memory order, and after a one-token sink a transposed k made an F-order
            # sink that the native views refuse, so every later attend failed.
            held = sink_k.shape[1]
            new_sink_k = np.empty((H, held + to_sink, D), np.float16)
            new_sink_v = np.empty((H, held + to_sink, D), np.float16)
            new_sink_k[:, :held], new_sink_k[:, held:] = sink_k, k[:, :to_sink]
            new_sink_v[:, :held], new_sink_v[:, held:] = sink_v, v[:, :to_sink]

        # 2. The rest, tail[:tail_len] then k[:, to_sink:], in "rest" positions 0..rest-1: its whole
        # tiles are quantised straight into the records buffer past num_tiles, where no published
        # state reads (may raise: nothing visible is changed yet), a chunk of tiles at a time.
        if n_full:
            records = self._records_with_room(records, num_tiles, num_tiles + n_full)
            staged = self._staged_records(state)
            self._quantize_rest(records, num_tiles, n_full, tail_k, tail_v, tail_len, k, v, to_sink, threads, staged)
        left = rest - n_full * G
        # A decode step that completes a tile (left == 0) hands the tail buffers on to the new
        # state, whose tail is empty, frozen: nothing is written into them now, and the next write
        # copies them unless no other state can read them any more (_settle_frozen_tail). A
        # fresh zeroed pair for every tile costs up to ~200-250 µs of page faults per 512 KB on the
        # Zen 3 box where the allocator hands out fresh pages. quantize_on="fill" only: with "next"
        # the token after a full tail stays in the new tail (left >= 1), which gets fresh buffers.
        reuse_tail = left == 0 and n_full > 0
        if not reuse_tail:
            # Fresh tail buffers: the first `left` slots change, and the old state's readers read them.
            # Nothing of the old tail stays in it: on this path either the sink was still filling (the tail was
            # empty) or a tile completed, which takes the whole old tail (tail_len <= n_full * G). So the new
            # tail is the input's last `left` tokens.
            new_tail_k, new_tail_v = np.zeros_like(tail_k), np.zeros_like(tail_v)
            new_tail_k[:, :left] = k[:, n - left :]  # fp16 rounding as astype
            new_tail_v[:, :left] = v[:, n - left :]
            tail_k, tail_v = new_tail_k, new_tail_v
        staged = self._stage_full_tail(tail_k, tail_v, left, num_tiles + n_full, threads)  # may raise

        # 3. Commit (no exceptions past this point).
        self._commit(new_sink_k if new_sink_k is not None else sink_k, new_sink_v if new_sink_v is not None else sink_v,
                     records, num_tiles + n_full, tail_k, tail_v, left, reuse_tail, staged)

    def _commit(self, sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len, reuse_tail, staged=None) -> None:
        """Publishes an append's new state (no exceptions here). reuse_tail: the tail buffers are the
        previous state's, handed on with an empty tail after a tile completed in them."""
        if self._frozen_records is not None and records is not self._frozen_records:
            self._frozen_records = None  # replaced: do not keep the old buffer alive
        # Fresh buffers need no mark; handed-on ones are marked before they are published, so that no
        # exception can leave them unmarked.
        self._frozen_tail = [tail_k, tail_v] if reuse_tail else None
        self._publish(sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len)
        self._set_staged(staged)

    def reserve(self, num_tokens: int) -> None:
        """Makes room for ``num_tokens`` tokens in all, so that appends up to that length never grow the
        records buffer. Without it the buffer grows by a quarter when full, copying the records written so
        far (a token-by-token decode from 1K to 32K tokens at Hk 8, D 128 took 3-5 µs more per append, and its
        slowest append 33-35 ms against under 7 ms with the room reserved: README). The room is zeroed memory,
        which glibc maps lazily for large buffers (pages are backed as records land in them);
        ``allocated_nbytes`` counts it. ``copy()`` keeps the room; ``truncate`` below the tile count, pickling
        and ``from_parts`` make buffers without it. A ``num_tokens`` within the room already there changes nothing."""
        num_tokens = check_positive_int(num_tokens, "num_tokens", 0, 2**62)
        with self._append_lock:
            state = self._state
            sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len = state
            # At most this many tiles are quantised when the cache holds num_tokens (with quantize_on="next",
            # one fewer at a tile boundary).
            tiles = max(0, num_tokens - self.sink_tokens) // self.preset.group
            if tiles <= records.shape[0]:
                return
            grown = _ops.zeros_or_memory_error((tiles, self.num_kv_heads, self._record_bytes), np.uint8,
                                               f"num_tokens: {num_tokens} tokens need", "records")
            grown[:num_tiles] = records[:num_tiles]
            staged = self._staged_records(state)
            self._frozen_records = None  # fresh: no other state reads it
            self._publish(sink_k, sink_v, grown, num_tiles, tail_k, tail_v, tail_len)
            self._set_staged(staged)

    def _records_with_room(self, records, num_tiles, need):
        """A records buffer holding records[:num_tiles] with room for `need` tiles that appends may
        write past num_tiles: `records` itself, or a grown copy - by a quarter (amortised O(1) per tile,
        at most ~25 % spare), not by doubling, which can leave half of the buffer unused in a cache meant
        to save memory. A frozen buffer (see rollback) is copied even when it has room."""
        if need <= records.shape[0] and records is not self._frozen_records:
            return records
        capacity = (records.shape[0] if need <= records.shape[0]  # a frozen copy keeps its size
                    else max(records.shape[0] + records.shape[0] // 4, need, 4))
        grown = np.zeros((capacity, self.num_kv_heads, self._record_bytes), np.uint8)
        grown[:num_tiles] = records[:num_tiles]
        return grown

    def _quantize_tail_tile(self, tail_k, tail_v, num_tiles, threads, out=None) -> np.ndarray:
        """The records [H, record_bytes] (into out when given) of a whole tail, fp16 [H, G, D]: the cache's
        tile number num_tiles, as its errors name it."""
        G = self.preset.group
        start = self.sink_tokens + num_tiles * G
        return quantize_tiles_native(tail_k, tail_v, self.preset, self.iters, threads,
                                     lambda i: f"head {i} of the tile of tokens {start}..{start + G - 1}", out=out)

    def _stage_full_tail(self, tail_k, tail_v, tail_len, num_tiles, threads):
        """quantize_on="next": the records of a tail that this append fills (None otherwise), quantised now
        so that a tile that cannot be quantised is refused by the append that fills it (it would make
        every later append fail); the next append publishes them instead of quantising again."""
        if self.quantize_on != "next" or tail_len != self.preset.group:
            return None
        return self._quantize_tail_tile(tail_k, tail_v, num_tiles, threads)

    def _staged_records(self, state):
        """The records _stage_full_tail quantised for state's full tail, or None (staged for another state, or none)."""
        return self._staged[1] if self._staged is not None and self._staged[0] is state else None

    def _set_staged(self, records) -> None:
        # Tied to the state just published (by identity): any other state (a rollback, a truncate, a
        # copy) quantises its full tail again at its next append.
        self._staged = None if records is None else (self._state, records)

    def _writable_tail(self, tail_k, tail_v):
        """The tail buffers to write past tail_len: copies of a frozen pair, whose slots past tail_len
        other states may read (see _frozen_tail); otherwise the buffers themselves."""
        frozen = self._frozen_tail
        if frozen is not None and tail_k is frozen[0]:
            return tail_k.copy(), tail_v.copy()
        return tail_k, tail_v

    def _settle_frozen_tail(self) -> None:
        """Unfreezes the tail buffers when nothing but the current state holds them: no other state
        (a checkpoint, an attend in flight, the state before a rollback) can read them any more, and
        no new reader can reach one, so later appends may write into them in place."""
        frozen = self._frozen_tail
        if frozen is None or not _REFCOUNTS_EXACT:
            return
        # The current state's cached views hold the buffers too (the next attend rebuilds them);
        # a reader that has taken them keeps its own reference, and the buffers stay marked.
        self.__dict__.pop("_parts_cache", None)
        # What _refs gives for an object that only a list holds, measured here beside the real reads
        # (the same bytecode, warmed up as they are), plus one: the current state's tuple.
        current = _refs([object()], 0) + 1
        if _refs(frozen, 0) <= current and _refs(frozen, 1) <= current:
            self._frozen_tail = None

    # Records per native call when quantising many tiles (a long prompt): bounds the float
    # copies to a few MB whatever the prompt's length.
    _QUANTIZE_CHUNK_RECORDS = 128

    def _quantize_rest(self, records, num_tiles, n_full, tail_k, tail_v, tail_len, k, v, to_sink, threads, staged=None):
        """Quantises tiles 0..n_full-1 of tail[:, :tail_len] ++ k[:, to_sink:] (same for v) into
        records[num_tiles : num_tiles + n_full]. Tiles are quantised from the values rounded to
        fp16, as they would be from the fp16 tail, so how tokens are split into appends never
        changes a record."""
        H, G, D = self.num_kv_heads, self.preset.group, self.head_dim
        out = records[num_tiles : num_tiles + n_full].reshape(n_full * H, self._record_bytes)

        def quantize(tk, tv, first, round_to_f16):  # tk, tv: C-contiguous [n * H, G, D], tiles first..first+n-1
            m = tk.shape[0]

            def describe(i):  # the cache positions of pair i's tokens
                start = self.sink_tokens + (num_tiles + first + i // H) * G
                return f"head {i % H} of the tile of tokens {start}..{start + G - 1}"

            quantize_tiles_native(tk, tv, self.preset, self.iters, threads, describe, out=out[first * H : first * H + m],
                                  round_to_f16=round_to_f16)

        first = 0
        if staged is not None:  # tile 0 is the full tail, quantised when it filled (quantize_on="next")
            out[:H] = staged
            first = 1
        elif tail_len:
            # Tile 0 starts in the tail: completed in the tail buffer itself ([H, G, D], one tile per
            # head), past tail_len where no published state reads - as the decode path writes - so
            # that no copy of the tile is assembled.
            tail_k, tail_v = self._writable_tail(tail_k, tail_v)
            tail_k[:, tail_len:] = k[:, to_sink : to_sink + G - tail_len]  # rounded to fp16 as astype
            tail_v[:, tail_len:] = v[:, to_sink : to_sink + G - tail_len]
            self._quantize_tail_tile(tail_k, tail_v, num_tiles, threads, out=out[:H])
            first = 1
        # One native input format per call: fp16, or float32 rounded to fp16 natively. Anything else
        # (float64, k and v of different dtypes) becomes fp16 a chunk at a time in numpy: one rounding,
        # where float64 -> float32 -> fp16 could round twice.
        as_f16 = k.dtype != v.dtype or k.dtype == np.float64
        step = max(1, self._QUANTIZE_CHUNK_RECORDS // H)
        for a in range(first, n_full, step):
            b = min(n_full, a + step)
            start = to_sink + a * G - tail_len
            tiles = lambda x: np.ascontiguousarray(  # noqa: E731
                x[:, start : start + (b - a) * G].reshape(H, b - a, G, D).transpose(1, 0, 2, 3)).reshape(-1, G, D)
            if as_f16:
                quantize(tiles(k).astype(np.float16), tiles(v).astype(np.float16), a, False)
            else:
                quantize(tiles(k), tiles(v), a, k.dtype == np.float32)

    # ---- truncate ------------------------------------------------------------
    def _checked_length(self, length, n: int) -> int:
        length = check_positive_int(length, "length", 0)
        if length > n:
            raise ValueError(f"length: {length} is more than the cache's {n} tokens")
        return length

    def truncation_point(self, length: int) -> int:
        """Where to ``truncate`` so that appending tokens ``[point, length)`` again gives exactly
        the cache that only ever held the first ``length`` tokens: ``length`` itself, or the start
        of the quantised tile it would cut — with quantize_on="next" also of a quantised tile it
        would end on (such a cache holds that tile exact, in its tail)."""
        G = self.preset.group
        sink_len, num_tiles, tail_len = self._sizes()  # one snapshot: appends may run meanwhile
        length = self._checked_length(length, sink_len + num_tiles * G + tail_len)
        point = tile_cut_point(length, sink_len, G, num_tiles)
        body = length - min(length, sink_len)
        if point == length and self.quantize_on == "next" and body and not body % G and body // G <= num_tiles:
            return length - G
        return point

    def truncate(self, length: int) -> None:
        """Keeps the first ``length`` tokens (speculative decoding's rollback).

        Tokens can be removed from the fp16 tail and the sink, and whole quantised tiles can be
        dropped. A cut inside a quantised tile raises ValueError and leaves the cache as it was:
        that tile's tokens exist only as codes. To cut anywhere, truncate to
        ``truncation_point(length)`` and append the tokens from there to ``length`` again (they
        go to the fp16 tail). With quantize_on="next", a cut at a tile's end leaves that tile
        quantised where a cache that never held more tokens would still hold it exact (until its
        next append); ``truncation_point`` avoids that.
        """
        with self._append_lock:
            length = self._checked_length(length, len(self))
            sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len = self._state
            start = tile_cut_point(length, sink_k.shape[1], self.preset.group, num_tiles)
            if start != length:
                raise ValueError(
                    f"length: {length} cuts the quantised tile of tokens {start}..{start + self.preset.group - 1}, "
                    f"whose tokens are stored only as codes; truncate to {start} and append the kept tokens again"
                )
            if length == len(self):
                return
            kept_sink = min(length, sink_k.shape[1])
            tiles, left = divmod(length - kept_sink, self.preset.group)  # left: tokens kept in the tail
            if tiles < num_tiles:
                # Fresh arrays: a reader may still hold the old state, and appends write records
                # past the tile count in place.
                records = records[:tiles].copy()
            new_tail_k, new_tail_v = np.zeros_like(tail_k), np.zeros_like(tail_v)
            new_tail_k[:, :left] = tail_k[:, :left]
            new_tail_v[:, :left] = tail_v[:, :left]
            # length < len(self), so tiles <= num_tiles, and left <= tail_len where tiles == num_tiles.
            if records is not self._frozen_records:
                self._frozen_records = None  # a kept frozen buffer stays frozen: appends would write into it
            self._frozen_tail = None
            self._publish(sink_k[:, :kept_sink].copy(), sink_v[:, :kept_sink].copy(), records, tiles,
                          new_tail_k, new_tail_v, left)

    # ---- checkpoint / rollback ----------------------------------------------------
    def checkpoint(self) -> "Checkpoint":
        """The cache's current content, to return to with ``rollback`` — e.g. before appending a
        speculative decoder's draft tokens, or several rows' tokens that must land together.
        Unlike ``truncate`` it returns exactly, also across tiles quantised since (no re-append).
        Taking one copies nothing: appends and truncates write only past the content of any
        earlier moment, or into new buffers. It keeps the buffers of that moment alive (a grown
        records buffer's predecessor, say): drop it when it is no longer needed."""
        return Checkpoint(self, self._state)

    def rollback(self, checkpoint: "Checkpoint") -> None:
        """Returns the cache to ``checkpoint`` (taken from this cache with ``checkpoint()``); every
        checkpoint of the cache stays usable, in any order. Copies nothing at once: the restored
        buffers are frozen, and the next append that writes into one copies it first (the tail,
        at most one tile, on the next append, unless by then nothing else holds it - the checkpoint
        and every newer state dropped; the records on the next completed tile, unless the records
        buffer is the cache's current one and no newer state completed a tile in it), because newer
        checkpoints and attend calls in flight may still read them past the restored lengths. A
        checkpoint of another cache raises ValueError and changes nothing."""
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"checkpoint: expected a KVCache.checkpoint() result, got {type(checkpoint).__name__}")
        if checkpoint._cache is not self:
            raise ValueError("checkpoint: taken from another cache")
        with self._append_lock:
            self._rollback_locked(checkpoint)

    def _rollback_locked(self, checkpoint: "Checkpoint") -> None:
        """rollback's work; the caller holds the append lock."""
        state = checkpoint._state
        records, num_tiles = state[2], state[3]
        # The records need no freeze when no state ever held more tiles in that buffer (a
        # speculative draft that completed no tile): copying them on every rollback made a
        # checkpoint / draft / rollback step cost O(context).
        clean = records is self._records_seen and self._records_high_water <= num_tiles
        self._frozen_records = None if clean else records
        self._frozen_tail = [state[4], state[5]]  # settled at the next append once the checkpoint is dropped
        self._publish(*state)

    # append_attend's hooks (as FP16Cache's): where a step's tokens can be attended together, and its undo
    def _tokens_before_quantising(self) -> int:
        """Tokens an append can take before one of them completes a tile (quantize_on="fill") or makes
        the full tail a tile ("next"): up to there every new token stays in full precision."""
        sink_len, _, tail_len = self._sizes()
        room = self.preset.group - tail_len - (1 if self.quantize_on == "fill" else 0)
        return max(0, self.sink_tokens - sink_len) + room

    def _undo_point(self) -> "Checkpoint":
        return self.checkpoint()

    def _undo_locked(self, point: "Checkpoint") -> None:  # the caller holds the append lock
        self._rollback_locked(point)

    def _publish(self, sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len) -> None:
        # One tuple assignment is atomic under the GIL: readers (attend) take the whole state
        # from self._state and never see new records with an old count or the reverse.
        self._state = (sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len)
        self._staged = None  # see _set_staged
        if self._frozen_tail is not None and tail_k is not self._frozen_tail[0]:
            self._frozen_tail = None  # a state with other tail buffers
        if records is self._frozen_records:
            self._records_seen = None  # restored by a rollback: what other states hold in it is unknown
        elif records is self._records_seen:
            self._records_high_water = max(self._records_high_water, num_tiles)
        else:
            self._records_seen, self._records_high_water = records, num_tiles
        # The last attend's view would keep that state's buffers alive until the next attend (past a
        # truncate(0), say); readers keep their own reference to the view they use.
        self.__dict__.pop("_parts_cache", None)

    # ---- parts (persistence, other backends) ----------------------------------
    def to_parts(self) -> dict[str, Any]:
        """The cache's content as arrays (copies): sink_k, sink_v [Hk, sink_len, D] and tail_k,
        tail_v [Hk, tail_len, D] float16, records uint8 [num_tiles, Hk, record_bytes] (SPEC §6),
        and the settings ``from_parts`` needs (preset, sink_tokens, iters, quantize_on)."""
        sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len = self._state  # one snapshot
        return {
            "sink_k": sink_k.copy(), "sink_v": sink_v.copy(), "records": records[:num_tiles].copy(),
            "tail_k": tail_k[:, :tail_len].copy(), "tail_v": tail_v[:, :tail_len].copy(),
            "preset": self._preset_for_parts(), "sink_tokens": self.sink_tokens, "iters": self.iters,
            "quantize_on": self.quantize_on,
        }

    def _preset_for_parts(self):
        # A built-in preset by name; a custom kvarn.Preset as itself (its name alone could not be resolved).
        return self.preset.name if PRESETS.get(self.preset.name) == self.preset else self.preset

    @classmethod
    def from_parts(cls, sink_k: ArrayLike, sink_v: ArrayLike, records: ArrayLike, tail_k: ArrayLike,
                   tail_v: ArrayLike, *, preset: PresetLike = DEFAULT_PRESET, sink_tokens: int | None = None,
                   iters: int = SINKHORN_ITERS, quantize_on: str = "fill") -> KVCache:
        """A cache holding the given content (``to_parts`` output, or records from another backend):
        sink and tail [Hk, n, D] float (stored as float16), records uint8 [tiles, Hk, record_bytes].
        Checks shapes, that the parts fit together as appends would have left them (the sink full
        before any tile or tail token, the tail shorter than a tile — or at most one with
        quantize_on="next") and that every record's scales are finite. Keys that decode beyond what
        the query check assumes (see check_key_norms) are not refused here — appends can make them
        too, from extreme inputs — but the CPU kernels report a non-finite output (ValueError) and
        the GPU's load_cpu refuses them."""
        from .tile import Tile

        sink_k = as_float_array(sink_k, "sink_k", ndim=3, fp16_range=True)
        H, D = sink_k.shape[0], sink_k.shape[2]  # an empty sink is [Hk, 0, D], as to_parts gives it
        if H == 0:  # sink_k gives the cache's heads: name it, not the constructor's num_kv_heads
            raise ValueError(f"sink_k: expected shape [num_kv_heads, n, head_dim] with num_kv_heads >= 1, "
                             f"got {sink_k.shape}")
        check_head_dim(D, "sink_k.shape[-1]")
        cache = cls(H, D, preset, sink_tokens, iters=iters, quantize_on=quantize_on)
        G, R = cache.preset.group, cache._record_bytes
        parts = {"sink_k": sink_k}
        for name, x in (("sink_v", sink_v), ("tail_k", tail_k), ("tail_v", tail_v)):
            parts[name] = as_float_array(x, name, ndim=3, fp16_range=True)
        for name, x in parts.items():
            if x.shape[0] != H or x.shape[2] != D:
                raise ValueError(f"{name}: expected shape [{H}, n, {D}] (num_kv_heads, tokens, head_dim), got {x.shape}")
        for a, b in (("sink_k", "sink_v"), ("tail_k", "tail_v")):
            if parts[a].shape != parts[b].shape:
                raise ValueError(f"{b}: shape {parts[b].shape} does not match {a}'s {parts[a].shape}")
        try:
            records = np.asarray(records)
        except (TypeError, ValueError, RuntimeError) as e:  # e.g. a ragged list
            raise TypeError(f"records: cannot be read as a numpy array ({e}); pass uint8 records") from None
        if records.dtype != np.uint8:  # a wrong type is a TypeError, as for the other arguments
            raise TypeError(f"records: expected uint8 [tiles, {H}, {R}] ({cache.preset.name}, head_dim {D}), "
                            f"got {records.dtype} {records.shape}")
        if records.ndim != 3 or records.shape[1:] != (H, R):
            raise ValueError(f"records: expected uint8 [tiles, {H}, {R}] ({cache.preset.name}, head_dim {D}), "
                             f"got {records.dtype} {records.shape}")
        sink_len, tiles, tail_len = parts["sink_k"].shape[1], records.shape[0], parts["tail_k"].shape[1]
        if sink_len > cache.sink_tokens:
            raise ValueError(f"sink_k: {sink_len} tokens is more than sink_tokens={cache.sink_tokens}")
        if (tiles or tail_len) and sink_len < cache.sink_tokens:
            raise ValueError(f"sink_k: {sink_len} of {cache.sink_tokens} sink tokens, yet tiles or tail tokens follow")
        max_tail = G if quantize_on == "next" else G - 1
        if tail_len > max_tail:
            raise ValueError(f"tail_k: {tail_len} tokens; the tail holds at most {max_tail} (quantize_on={quantize_on!r})")
        if tiles:
            Tile.from_records(records.reshape(tiles * H, R), cache.preset, D, argname="records")  # raises on corrupt scales
        tail_k16 = np.zeros((H, G, D), np.float16)
        tail_v16 = np.zeros((H, G, D), np.float16)
        tail_k16[:, :tail_len] = parts["tail_k"]
        tail_v16[:, :tail_len] = parts["tail_v"]
        try:  # a full tail under quantize_on="next": refused here if it cannot be quantised (as append refuses it)
            staged = cache._stage_full_tail(tail_k16, tail_v16, tail_len, tiles, None)
        except ValueError as e:
            raise ValueError(f"tail_k, tail_v: {e}") from None
        # C order whatever the parts' order: the native views, records and in-place appends assume it.
        cache._publish(np.array(parts["sink_k"], np.float16, order="C"), np.array(parts["sink_v"], np.float16, order="C"),
                       np.array(records, np.uint8, order="C"), tiles, tail_k16, tail_v16, tail_len)
        cache._set_staged(staged)
        return cache

    # ---- reading -------------------------------------------------------------
    def _native_parts(self) -> dict:
        return _ops.native_parts(self)

    def _view_args(self, state) -> tuple:  # _native.CacheView's arguments for one state
        sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len = state
        p = self.preset
        return (self.num_kv_heads, self.head_dim, p.group, p.kbits, p.vbits, sink_k, sink_v, sink_k.shape[1], records,
                num_tiles, tail_k, tail_v, tail_len)

    def dequantize(self) -> tuple[np.ndarray, np.ndarray]:
        """(K̂, V̂) float32 [num_kv_heads, len, head_dim]: what attention sees. For tests and
        inspection only — attend() never builds this."""
        H, G, D = self.num_kv_heads, self.preset.group, self.head_dim
        sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len = self._state  # one snapshot
        parts_k = [sink_k.astype(np.float32)]
        parts_v = [sink_v.astype(np.float32)]
        if num_tiles:
            flat = records[:num_tiles].reshape(num_tiles * H, self._record_bytes)
            k, v = _ops.dequantize_records_native(flat, self.preset, D)
            parts_k.append(k.reshape(num_tiles, H, G, D).transpose(1, 0, 2, 3).reshape(H, -1, D))
            parts_v.append(v.reshape(num_tiles, H, G, D).transpose(1, 0, 2, 3).reshape(H, -1, D))
        parts_k.append(tail_k[:, :tail_len].astype(np.float32))
        parts_v.append(tail_v[:, :tail_len].astype(np.float32))
        return np.concatenate(parts_k, axis=1), np.concatenate(parts_v, axis=1)

    def attend(self, q: ArrayLike, scale: float | None = None, *, num_threads: int | None = None) -> np.ndarray:
        """kvarn.attend(q, self, scale, num_threads=num_threads): q [Hq, D] -> float32 [Hq, D]."""
        return attend(q, self, scale, num_threads=num_threads)

    def copy(self) -> "KVCache":
        """An independent cache with the same settings and contents (appends to either leave the
        other unchanged). The records buffer is shared, not copied (beam search and parallel sampling
        copy caches every step): records never change once written, and this cache writes new ones
        only past its tile count (a rollback or truncate below it copies or freezes the buffer first),
        which the copy does not read; the copy gets the buffer frozen and copies it before its first
        completed tile (as after a rollback). The sink and tail are copied (at most one tile each);
        ``nbytes`` counts the shared records in each cache."""
        sink_k, sink_v, records, num_tiles, tail_k, tail_v, tail_len = self._state  # one snapshot
        new = object.__new__(type(self))  # a subclass copies into its own type
        # A snapshot of __dict__ (one C call): attend adds _parts_cache and appends remove it meanwhile,
        # and iterating the live dict then raised 'dictionary changed size during iteration'.
        new.__dict__.update({k: v for k, v in self.__dict__.copy().items()
                             if k not in ("_state", "_append_lock", "_parts_cache", "_frozen_records", "_frozen_tail",
                                          "_records_seen", "_records_high_water")})
        new._append_lock = _ops.new_append_lock(new)
        new._frozen_records, new._frozen_tail = records, None
        new._records_seen, new._records_high_water = None, 0
        new._publish(sink_k.copy(), sink_v.copy(), records, num_tiles, tail_k.copy(), tail_v.copy(), tail_len)
        return new

    # copy.copy / copy.deepcopy give an independent cache too: a shallow copy would share the tail
    # buffer, which appends write in place.
    def __copy__(self) -> "KVCache":
        return self.copy()

    def __deepcopy__(self, memo) -> "KVCache":
        # The buffers are fresh in copy(); attributes beyond a fresh KVCache's (a subclass's, say)
        # are deep-copied too, which copy() alone would share with this cache.
        new = memo[id(self)] = self.copy()
        for key in _ops.extra_attributes(self, KVCache):
            new.__dict__[key] = copy.deepcopy(self.__dict__[key], memo)
        return new

    # pickle goes through the public parts (the lock and the buffers' spare capacity stay behind): the
    # unpickled cache has the same type, settings and content, and further appends give the same records.
    def __reduce__(self):
        parts = self.to_parts()
        # Instance attributes beyond a fresh KVCache's (a subclass's, say) travel too, as copy() keeps them.
        extra = {k: self.__dict__[k] for k in _ops.extra_attributes(self, KVCache)}
        return KVCache._unpickle, (type(self), parts), extra or None

    @staticmethod
    def _unpickle(cls, parts: dict) -> "KVCache":
        # pickle's reconstructor (found by its qualified name, kvarn.cache.KVCache._unpickle). Built as a
        # KVCache, then given its class: a subclass's __init__ may take other arguments than KVCache's.
        obj = KVCache.from_parts(**parts)
        obj.__class__ = cls
        return obj

    def __repr__(self) -> str:
        sink_len, num_tiles, tail_len = sizes = self._sizes()
        n = sink_len + num_tiles * self.preset.group + tail_len
        return (
            f"KVCache(kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, preset={self.preset.label()}, "
            f"tokens={n} [sink {sink_len}, tiles {num_tiles}, tail {tail_len}], {self._ratio(*sizes):.2f}x vs fp16)"
        )


def check_key_norms(records: np.ndarray, preset, head_dim: int, num_kv_heads: int, argname: str) -> None:
    """Raises ValueError unless records [n, record_bytes] decode to keys whose per-token L2 norm stays
    below sqrt(head_dim) * 2**17, what check_queries assumes (|q . k| <= head_dim * max|q| * 2**17).
    Real models' keys are orders of magnitude below; the quantiser can go beyond it from extreme
    inputs (spikes of +-65504 in a token at head_dim 16-64 decode to up to ~40x the limit), and imported
    scales can (60000 each: ~1e11). K[t, d] = (code * ka[d] + kz[d]) * kt[t] (SPEC §5): a bound from
    the scale vectors clears nearly every record (2.5 ms for 32K tokens x 8 heads, where decoding
    every record natively cost ~450 ms); those it does not are decoded exactly here (the norm is the
    same in the rotated frame, so no inverse Hadamard)."""
    from .tile import _field_views, unpack_codes

    limit = np.sqrt(head_dim) * 2.0**17
    fields = _field_views(records, preset, head_dim)
    ka, kz, kt = (fields[name].astype(np.float32) for name in ("ka", "kz", "kt"))
    # fp16 inputs keep every product below ~1e15: no float32 overflow in here.
    per_channel = np.maximum(np.abs(kz), np.abs((2**preset.kbits - 1) * ka + kz))  # max |code * ka + kz|
    bound = np.sqrt(np.einsum("nd,nd->n", per_channel, per_channel)) * np.abs(kt).max(axis=1)
    suspects = np.flatnonzero(~(bound <= limit))
    for start in range(0, len(suspects), 256):
        idx = suspects[start : start + 256]
        keys = unpack_codes(fields["k_codes"][idx], preset.kbits) * ka[idx, :, None] + kz[idx, :, None]  # [n, D, G]
        norms = np.sqrt(np.einsum("ndg,ndg->ng", keys, keys)) * np.abs(kt[idx])
        bad = np.flatnonzero(~(norms.max(axis=1) <= limit))
        if len(bad):
            i = int(idx[bad[0]])
            raise ValueError(
                f"{argname}: tile {i // num_kv_heads}, kv head {i % num_kv_heads} decodes to keys of L2 norm "
                f"{float(norms[bad[0]].max()):.3g}, beyond the {limit:.3g} the query check assumes at head_dim "
                f"{head_dim} (attention scores over them could overflow float32)"
            )


class Checkpoint:
    """A KVCache's content at one moment (``KVCache.checkpoint()``); see ``KVCache.rollback``."""

    __slots__ = ("_cache", "_state")

    def __init__(self, cache: KVCache, state: tuple):
        self._cache, self._state = cache, state

    def __len__(self) -> int:
        return self._cache._length(self._state)

    def __repr__(self) -> str:
        return f"<kvarn.KVCache checkpoint of {len(self)} tokens>"

    # A checkpoint is a link to one cache: a copy of it alone must still roll that cache back.
    def __copy__(self) -> "Checkpoint":
        return self

    def __deepcopy__(self, memo) -> "Checkpoint":
        """Itself, unless its cache is deep-copied in the same operation and before it (a
        ``copy.deepcopy((cache, checkpoint))``): then a checkpoint of the copied cache, holding its own
        copy of this one's content (a checkpoint listed before its cache stays this one)."""
        twin = memo.get(id(self._cache))
        if twin is None:
            return self
        # Copies of the state's buffers, not the copied cache's current ones: rollback freezes them
        # there, as on the original (buffers shared by several checkpoints stay shared, through memo).
        return Checkpoint(twin, copy.deepcopy(self._state, memo))

    def __reduce_ex__(self, protocol):
        raise TypeError(
            "cannot pickle a kvarn.KVCache checkpoint (kvarn.cache.Checkpoint): it is a link to its cache, which "
            "pickling cannot keep; roll the cache back to it and pickle the cache (or its to_parts()) instead"
        )


def attend(q: ArrayLike, cache: KVCache, scale: float | None = None, *, num_threads: int | None = None) -> np.ndarray:
    """Exact-softmax decode attention of q [Hq, D] over every token in the cache.

    Hq must be a multiple of the cache's kv heads (GQA: query head h reads kv
    head h // (Hq // Hk)). scale defaults to 1/sqrt(D). Returns float32 [Hq, D].
    """
    return _ops.attend_one(q, cache, KVCache, scale, num_threads)


def append_attend(q: ArrayLike, cache: KVCache, k: ArrayLike, v: ArrayLike, scale: float | None = None, *,
                  num_threads: int | None = None) -> np.ndarray:
    """A decode step of n tokens (a speculative decoder's draft to verify, forced or prompt tokens):
    appends k, v [Hk, n, D] and returns q [n, Hq, D]'s attention, float32 [n, Hq, D], token i's
    query over the cache up to and including token i (causal). The same as ``append`` of one
    token at a time with ``attend`` after each, bit for bit (README, Design decisions, names the
    one exception), but each run of tokens that completes no tile reads the cache once for all of
    them. Refused input (shapes, NaN/Inf, a query that could overflow) appends nothing. The step
    holds the cache's append lock: other threads' appends land wholly before or after it.
    """
    return _ops.append_attend_caches(q, cache, k, v, KVCache, scale, num_threads, single=True)


def append_attend_batch(q: ArrayLike, caches: Sequence[KVCache], k: ArrayLike, v: ArrayLike,
                        scale: float | None = None, *, num_threads: int | None = None) -> np.ndarray:
    """append_attend() for B sequences in one native call per chunk: q [B, n, Hq, D], k and v [B, Hk,
    n, D] (or B arrays [Hk, n, D]), caches B KVCaches with the same kv heads and head_dim (any
    lengths). Returns float32 [B, n, Hq, D]. All or nothing: a refused row appends nothing anywhere."""
    return _ops.append_attend_caches(q, caches, k, v, KVCache, scale, num_threads)


def attend_batch(q: ArrayLike, caches: Sequence[KVCache], scale: float | None = None, *,
                 num_threads: int | None = None) -> np.ndarray:
    """attend() for many sequences in one native call: q [B, Hq, D], caches a list of B KVCaches
    with the same kv heads and head_dim (any lengths and presets). Returns float32 [B, Hq, D]."""
    return _ops.attend_caches(q, caches, KVCache, scale, num_threads)
