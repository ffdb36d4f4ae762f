"""FP16Cache: an uncompressed fp16 KV cache served by the same native decode
attention as KVCache (attend_dense_f16 of the active ISA, same threads, same
flash-decoding split and merge).

It exists as the fair baseline for kvarn's speed claim: "k4v2 attention beats
attention over an uncompressed cache" is measured against this, an equally
optimised kernel reading fp16 K/V, not against numpy.

    cache = kvarn.fp16cache.FP16Cache(num_kv_heads=8, head_dim=128)
    cache.append(k, v)                  # [Hk, n, D] float16/bfloat16/float32/float64
    out = cache.attend(q)               # q [Hq, D] -> float32 [Hq, D]

Natively it is a cache whose every token is "sink" (kept in full precision),
so it goes through kvarn_attend unchanged.
"""
from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import _ops
from ._ops import check_head_dim, check_kv, check_positive_int, plain_tokens, store_tokens

if TYPE_CHECKING:  # annotations only
    from numpy.typing import ArrayLike


class FP16Cache:
    """Keys and values of one sequence, all kv heads of one layer, stored as float16.

    Thread-safe as KVCache is: appends are serialised, and readers take one snapshot
    (buffers, length); an append writes only past the published length, or into new buffers."""

    def __init__(self, num_kv_heads: int, head_dim: int, capacity: int = 0) -> None:
        self._num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self._head_dim = check_head_dim(head_dim)
        capacity = check_positive_int(capacity, "capacity", 0)
        k = np.zeros((self.num_kv_heads, capacity, self.head_dim), np.float16)
        self._state = (k, np.zeros_like(k), 0)  # (K buffer, V buffer, tokens): replaced whole
        self._append_lock = _ops.new_append_lock(self)

    # Read-only (as KVCache's): appends and attend size their buffers from them.
    @property
    def num_kv_heads(self) -> int:
        """KV heads (fixed at construction)."""
        return self._num_kv_heads

    @property
    def head_dim(self) -> int:
        """Channels per token (fixed at construction)."""
        return self._head_dim

    def __len__(self) -> int:
        return self._state[2]

    @property
    def nbytes(self) -> int:
        """Bytes holding the cached tokens (K and V, fp16)."""
        return 2 * 2 * self.num_kv_heads * self.head_dim * len(self)

    def append(self, k: ArrayLike, v: ArrayLike, *, num_threads: int | None = None) -> None:
        """Appends n tokens: k, v of shape [num_kv_heads, n, head_dim], float16, bfloat16, float32 or
        float64, stored as their fp16 rounding. (num_threads: KVCache.append's, for code written for
        both; nothing here is quantised.)"""
        with self._append_lock:
            self._append_locked(k, v)

    def _append_locked(self, k, v, num_threads: int | None = None) -> None:
        """append's work; the caller holds the append lock."""
        H, D = self.num_kv_heads, self.head_dim
        checked_on_store = plain_tokens(k, v, H, D)  # float32 / float16: checked as they are stored, below
        if not checked_on_store:
            k, v = check_kv(k, v, H, D)
        n = k.shape[1]
        if n == 0:
            return
        kbuf, vbuf, length = self._state
        need = length + n
        if need > kbuf.shape[1]:
            cap = max(need, 2 * kbuf.shape[1], 256)
            grown = []
            for old in (kbuf, vbuf):
                new = np.zeros((H, cap, D), np.float16)
                new[:, :length] = old[:, :length]
                grown.append(new)
            kbuf, vbuf = grown
        # Past the published length: no reader looks there (nor at what a refused token leaves).
        store_tokens(k, v, kbuf[:, length:need], vbuf[:, length:need], checked_on_store)
        self._state = (kbuf, vbuf, need)

    def reserve(self, num_tokens: int) -> None:
        """Room for ``num_tokens`` tokens in all (KVCache.reserve's counterpart; the constructor's ``capacity``
        for a cache that holds tokens already): appends up to that length never grow, and so never copy, the
        buffers (they double when full). A ``num_tokens`` within the room already there changes nothing."""
        num_tokens = check_positive_int(num_tokens, "num_tokens", 0, 2**62)
        with self._append_lock:
            kbuf, vbuf, length = self._state
            if num_tokens <= kbuf.shape[1]:
                return
            new_k, new_v = _ops.zeros_or_memory_error((2, self.num_kv_heads, num_tokens, self.head_dim), np.float16,
                                                      f"num_tokens: {num_tokens} tokens need", "K and V")
            new_k[:, :length] = kbuf[:, :length]
            new_v[:, :length] = vbuf[:, :length]
            self._state = (new_k, new_v, length)  # readers of the old state keep the old buffers

    # append_attend's hooks (as KVCache's)
    def _tokens_before_quantising(self) -> int:
        return 2**62  # nothing is quantised: a step's tokens are attended together

    def _undo_point(self) -> tuple:
        return self._state

    def _undo_locked(self, state: tuple) -> None:  # the caller holds the append lock
        kbuf, vbuf, length = state
        # Fresh buffers (a refused step only): an attend still running over the refused tokens reads the
        # old ones past length, where the next append would write.
        self._state = (kbuf.copy(), vbuf.copy(), length)

    def copy(self) -> "FP16Cache":
        """An independent cache with the same contents."""
        kbuf, vbuf, length = self._state  # one snapshot
        new = object.__new__(type(self))  # a subclass copies into its own type
        new.__dict__.update(self._plain_attributes())  # known-good (not __setstate__'s checks); the buffers follow
        new._append_lock = _ops.new_append_lock(new)
        new._state = (kbuf[:, :length].copy(), vbuf[:, :length].copy(), length)
        return new

    def _plain_attributes(self) -> dict:
        """Everything but the lock (recreated) and the parts cache: a snapshot of __dict__ (one C call), since
        attend adds _parts_cache meanwhile, as KVCache.copy."""
        return {k: v for k, v in self.__dict__.copy().items() if k not in ("_append_lock", "_parts_cache")}

    # pickle: the plain attributes, the buffers without their spare capacity.
    def __getstate__(self) -> dict:
        state = self._plain_attributes()
        state["num_kv_heads"] = state.pop("_num_kv_heads")  # the public names, as pickles have always had
        state["head_dim"] = state.pop("_head_dim")
        kbuf, vbuf, length = self._state  # one snapshot
        state["_state"] = (kbuf[:, :length], vbuf[:, :length], length)
        return state

    def __setstate__(self, state: dict) -> None:
        # Unpickled bytes are checked as an append checks its input (KVCache's go through from_parts):
        # a NaN here would surface in attend as a float32 overflow blamed on the query.
        try:
            H = check_positive_int(state["num_kv_heads"], "num_kv_heads")
            D = check_head_dim(state["head_dim"])
            kbuf, vbuf, length = state["_state"]
            length = check_positive_int(length, "length", 0)
        except KeyError as e:
            raise ValueError(f"FP16Cache state: missing {e}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"FP16Cache state: {e}") from None
        for name, buf in (("K", kbuf), ("V", vbuf)):
            if not isinstance(buf, np.ndarray) or buf.dtype != np.float16 or buf.shape != (H, length, D):
                raise ValueError(f"FP16Cache state: {name} buffer must be float16 [{H}, {length}, {D}], got "
                                 f"{getattr(buf, 'dtype', type(buf).__name__)} {getattr(buf, 'shape', '')}")
            if not _ops._f16_all_finite(buf):
                raise ValueError(f"FP16Cache state: {name} buffer contains NaN or Inf")
        state = dict(state)
        del state["num_kv_heads"], state["head_dim"]  # read-only properties now: stored privately
        self.__dict__.update(state)
        self._num_kv_heads, self._head_dim = H, D
        self._state = (np.ascontiguousarray(kbuf), np.ascontiguousarray(vbuf), length)
        self._append_lock = _ops.new_append_lock(self)

    def __copy__(self) -> "FP16Cache":  # a shallow copy would share the buffers appends write into
        return self.copy()

    def __deepcopy__(self, memo) -> "FP16Cache":
        # Fresh buffers from copy(); attributes beyond a fresh FP16Cache's (a subclass's, say) deep-copied.
        new = memo[id(self)] = self.copy()
        for key in _ops.extra_attributes(self, FP16Cache):
            new.__dict__[key] = copy.deepcopy(self.__dict__[key], memo)
        return new

    def keys_values(self) -> tuple[np.ndarray, np.ndarray]:
        """(K, V) float16 [num_kv_heads, len, head_dim] read-only views (appends write past len in place)."""
        kbuf, vbuf, length = self._state
        return _ops.read_only(kbuf)[:, :length], _ops.read_only(vbuf)[:, :length]

    def _native_parts(self) -> dict:
        return _ops.native_parts(self)

    def _view_args(self, state) -> tuple:  # _native.CacheView's arguments for one state (as KVCache's)
        kbuf, vbuf, length = state
        H, D = self.num_kv_heads, self.head_dim
        no_records, no_tail = _empty_parts(H, D)
        # The whole capacity buffer as the sink: its row/head strides are what the view needs. The tile format
        # (group 128, k4v2) is unused while there are no tiles, but must be a valid one.
        return (H, D, 128, 4, 2, kbuf, vbuf, length, no_records, 0, no_tail, no_tail, 0)

    def attend(self, q: ArrayLike, scale: float | None = None, *, num_threads: int | None = None) -> np.ndarray:
        """Decode attention of q [Hq, D] over every cached token; float32 [Hq, D]."""
        return _ops.attend_one(q, self, FP16Cache, scale, num_threads)

    def __repr__(self) -> str:
        return f"FP16Cache(kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, tokens={len(self)})"


@functools.lru_cache(maxsize=64)
def _empty_parts(num_kv_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero-size records [0, H, 1] and tail [H, 0, D] of an FP16Cache's view (read-only, shared)."""
    records, tail = np.zeros((0, num_kv_heads, 1), np.uint8), np.zeros((num_kv_heads, 0, head_dim), np.float16)
    records.flags.writeable = tail.flags.writeable = False
    return records, tail


def append_attend_fp16_batch(q: ArrayLike, caches: Sequence[FP16Cache], k: ArrayLike,
                             v: ArrayLike, scale: float | None = None, *,
                             num_threads: int | None = None) -> np.ndarray:
    """kvarn.append_attend_batch over FP16Caches (the baseline for multi-token steps): q [B, n, Hq, D],
    k and v [B, Hk, n, D]; returns float32 [B, n, Hq, D], each sequence's n tokens in one native call."""
    return _ops.append_attend_caches(q, caches, k, v, FP16Cache, scale, num_threads)


def attend_fp16_batch(q: ArrayLike, caches: Sequence[FP16Cache], scale: float | None = None, *,
                      num_threads: int | None = None) -> np.ndarray:
    """Decode attention for B sequences in one native call: q [B, Hq, D], caches a list of
    B FP16Caches with the same kv heads and head_dim. Returns float32 [B, Hq, D]."""
    return _ops.attend_caches(q, caches, FP16Cache, scale, num_threads)
