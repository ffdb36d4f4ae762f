"""Validation, allocation and friendly errors around the native core.

The Cython module (`kvarn._native`) only takes typed buffers and returns a
status code; everything a user can get wrong is checked here first, so bad
input gets an exception that names the argument and the problem.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from . import _native

if TYPE_CHECKING:  # annotations only: numpy.typing is not imported at run time
    from numpy.typing import ArrayLike

FP16_MAX = 65504.0
FLOAT32_MAX = float(np.finfo(np.float32).max)
SUPPORTED_BITS = (2, 4, 8)
SUPPORTED_GROUPS = (64, 128)
SINKHORN_ITERS = 8
MAX_SINKHORN_ITERS = 1000  # a bound, so a typo cannot stall a call for hours (SPEC's default is 8)
MAX_THREADS = 4096  # KVARN_MAX_THREADS (kvarn.h)


@dataclass(frozen=True)
class Preset:
    """A quantisation format: key bits, value bits and tokens per tile."""

    name: str
    kbits: int
    vbits: int
    group: int

    def record_bytes(self, head_dim: int) -> int:
        """Bytes of one (tile, kv-head) record (SPEC §6); a format or head_dim kvarn does not serve raises."""
        p, head_dim = get_preset(self), check_head_dim(head_dim)
        return int(_native.record_layout(p.kbits, p.vbits, p.group, head_dim)["total"])

    def bits_per_element(self, head_dim: int) -> float:
        return float(8.0 * self.record_bytes(head_dim) / (2 * self.group * head_dim))  # a numpy int head_dim too

    def describe(self) -> str:
        """Name and format, for messages (a custom preset may reuse a built-in's name)."""
        return f"{self.name!r} (k{self.kbits}v{self.vbits}, {self.group}-token tiles)"

    def label(self) -> str:
        """For a repr: the quoted name, or describe() when a built-in of that name has another format."""
        builtin = PRESETS.get(self.name)
        other = builtin is not None and (builtin.kbits, builtin.vbits, builtin.group) != (self.kbits, self.vbits,
                                                                                          self.group)
        return self.describe() if other else repr(self.name)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("k4v2_g128", 4, 2, 128),
        Preset("k4v4_g128", 4, 4, 128),
        Preset("k4v2_g64", 4, 2, 64),
        Preset("k4v4_g64", 4, 4, 64),
        Preset("k2v2_g128", 2, 2, 128),
        # Extra (SPEC §6 allows 8 bits): near-lossless reference point.
        Preset("k8v8_g128", 8, 8, 128),
    )
}
DEFAULT_PRESET: str = "k4v2_g128"
# What a preset argument takes: a built-in name or a Preset (a run-time alias: Python 3.9 has no X | Y at run time).
PresetLike = Union[str, Preset]


def get_preset(preset) -> Preset:
    """The Preset a name or Preset stands for, checked; a custom one comes back with Python int fields
    (numpy ones, say uint8 bits, overflowed in the size arithmetic)."""
    if isinstance(preset, Preset):
        if not isinstance(preset.name, str):
            raise TypeError(f"preset: name {preset.name!r} is not a str")
        for field in ("kbits", "vbits", "group"):
            value = getattr(preset, field)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"preset: {preset.name!r} has {field}={value!r}; expected an int")
        if preset.kbits not in SUPPORTED_BITS or preset.vbits not in SUPPORTED_BITS:
            raise ValueError(
                f"preset: {preset.name!r} has k{preset.kbits}/v{preset.vbits} bits; kvarn supports {SUPPORTED_BITS}"
            )
        if preset.group not in SUPPORTED_GROUPS:
            raise ValueError(
                f"preset: {preset.name!r} has {preset.group}-token tiles; kvarn supports {SUPPORTED_GROUPS}"
            )
        if any(type(getattr(preset, f)) is not int for f in ("kbits", "vbits", "group")):
            preset = Preset(preset.name, int(preset.kbits), int(preset.vbits), int(preset.group))
        return preset
    if not isinstance(preset, str):
        raise TypeError(f"preset: expected a preset name (str) or a kvarn.Preset, got {type(preset).__name__}")
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[preset]


def check_head_dim(head_dim, name="head_dim") -> int:
    if isinstance(head_dim, (bool, np.bool_)) or not isinstance(head_dim, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(head_dim).__name__}")
    head_dim = int(head_dim)
    if head_dim < 16 or head_dim > 1024 or head_dim % 16:
        raise ValueError(
            f"{name}: unsupported head_dim {head_dim}; kvarn serves multiples of 16 from 16 to 1024"
        )
    return head_dim


def check_positive_int(value, name, minimum=1, maximum=2**31 - 1) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name}: must be <= {maximum}, got {value}")
    return int(value)


def zeros_or_memory_error(shape: tuple[int, ...], dtype, need: str, of: str) -> np.ndarray:
    """np.zeros(shape, dtype), or MemoryError "{need} {bytes} bytes of {of}, more than can be allocated" where it
    cannot be had (need names the argument that asked: "num_tokens: 4096 tokens need"). A size beyond the address
    space is checked first: numpy refuses that shape with a ValueError of its own."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    try:
        if nbytes > sys.maxsize:
            raise MemoryError
        return np.zeros(shape, dtype)
    except MemoryError:
        raise MemoryError(f"{need} {nbytes} bytes of {of}, more than can be allocated") from None


def check_iters(iters) -> int:
    return check_positive_int(iters, "iters", minimum=0, maximum=MAX_SINKHORN_ITERS)


_FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def _bfloat16_widened(x):
    """bfloat16 input (a torch tensor, or an ml_dtypes numpy array) as float32 — exact, bf16 being
    float32's upper half; None for anything else. numpy has no bfloat16 of its own, so without
    this a bf16 model's tensors could not be passed."""
    if isinstance(x, np.ndarray):
        if x.dtype.type in _FLOAT_DTYPES:  # the common case first: dtype.name costs ~2 us
            return None
        return x.astype(np.float32) if x.dtype.name == "bfloat16" else None
    if str(getattr(x, "dtype", "")) == "torch.bfloat16" and callable(getattr(x, "float", None)):
        return x.float()
    return None


def _plain_float_array(x, name):
    """x as a plain numpy array of a float dtype in native byte order (bfloat16 widened to float32)."""
    widened = _bfloat16_widened(x)
    if widened is not None:
        x = widened
    if not isinstance(x, np.ndarray):
        if hasattr(x, "__array__") or isinstance(x, (list, tuple)):
            try:
                x = np.asarray(x)
            except (TypeError, ValueError, RuntimeError) as e:  # e.g. a bfloat16 torch tensor
                raise TypeError(
                    f"{name}: cannot be read as a numpy array ({e}); pass float16, bfloat16, float32 or float64"
                ) from None
        else:
            raise TypeError(f"{name}: expected a numpy array, got {type(x).__name__}")
    elif type(x) is not np.ndarray:
        # A subclass (a masked array's hidden entries, a matrix): check all the data the native code
        # reads, not what the subclass's own max() shows.
        x = np.asarray(x)
    if x.dtype.type not in _FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; use float16, bfloat16, float32 or float64")
    if not x.dtype.isnative:  # big-endian data (np.frombuffer of a file, say): the native code reads native order
        x = x.astype(x.dtype.newbyteorder("="))
    return x


def as_float_array(x, name, ndim=None, fp16_range=False, with_max_abs=False):
    """Checks a float array argument (dtype, rank, finiteness, optional fp16 range). With
    with_max_abs, returns (x, max |x|) (0.0 for an empty array). bfloat16 is widened to float32."""
    if not (type(x) is np.ndarray and x.dtype is F32):  # else the common case, a plain float32 array
        x = _plain_float_array(x, name)
    if ndim is not None:
        allowed = ndim if isinstance(ndim, tuple) else (ndim,)
        if x.ndim not in allowed:
            want = " or ".join(f"{n}-D" for n in allowed)
            raise ValueError(f"{name}: expected a {want} array, got shape {x.shape}")
    if x.size == 0:
        max_abs = 0.0
    elif (x.dtype is F32 or x.dtype is F16) and x.ndim <= 3 and x.size <= _NATIVE_SCAN_MAX and x.flags.aligned:
        # One native pass (NaN, Inf and max |x| from the bit patterns' integer max) instead of numpy's
        # max and min (float16: and + max): a decode step's small arrays pay two reductions' call overhead
        # otherwise. Large ones go to numpy, whose wide-vector reductions are faster than the scan there.
        max_abs = _scanned_max_abs(x.reshape(_AS_3D[x.ndim] + x.shape), name)
    elif x.dtype == np.float16 and not with_max_abs:
        # numpy computes in fp16 element by element (|x|.max() of a 32K-token prompt: ~90 ms);
        # the exponent bits say the same in ~4 ms, and every finite fp16 is in range.
        if not _f16_all_finite(x):
            raise ValueError(f"{name}: contains NaN or Inf")
        max_abs = None
    else:
        # max and min: no |x| temporary the size of x. NaN propagates through both.
        hi, lo = float(x.max()), float(x.min())
        if not (math.isfinite(hi) and math.isfinite(lo)):
            raise ValueError(f"{name}: contains NaN or Inf")
        max_abs = max(hi, -lo)
    if fp16_range and x.dtype != np.float16 and max_abs > FP16_MAX:
        raise ValueError(f"{name}: values beyond the fp16 range (|x| > {FP16_MAX:g}) cannot be stored")
    return (x, max_abs) if with_max_abs else x


F32 = np.dtype(np.float32)  # the native-order descriptor numpy and torch's .numpy() hand out
F16 = np.dtype(np.float16)
_AS_3D = ((1, 1, 1), (1, 1), (1,), ())  # leading unit axes that make an n-D array 3-D, by n
_NATIVE_SCAN_MAX = 8192  # elements: as_float_array's native float32 check up to here (faster there; numpy's beyond)


def plain_tokens(k, v, num_kv_heads: int, head_dim: int) -> bool:
    """Whether k, v are plain float32 arrays, or float16 ones of at most _NATIVE_SCAN_MAX elements (one
    dtype), of one append's shape [num_kv_heads, n, head_dim]: the tokens that check_tokens_f16 checks and
    stores in one native pass each (check_kv checks anything else). A long float16 prompt is faster through
    numpy's chunked check and copy (a 32K-token FP16Cache append: 48 against 61 ms)."""
    return (type(k) is np.ndarray and type(v) is np.ndarray
            and (k.dtype is F32 or (k.dtype is F16 and k.size <= _NATIVE_SCAN_MAX))
            and v.dtype is k.dtype and k.ndim == 3 and k.shape == v.shape and k.shape[0] == num_kv_heads
            and k.shape[2] == head_dim and k.flags.aligned and v.flags.aligned)


def _scanned_max_abs(x: np.ndarray, name: str, out: np.ndarray | None = None) -> float:
    """max |x| of a 3-D float32 or float16 array by the native scan (kvarn_scan_f32 / _f16), which also
    writes x's fp16 rounding into out (float16, x's shape) when given and max |x| <= FP16_MAX; a
    ValueError names x when it holds NaN or Inf."""
    bits = None if out is None else out.view(np.uint16)
    if x.dtype is F16:
        rc, max_abs = _native.scan_f16(x.view(np.uint16), bits)
    else:
        rc, max_abs = _native.scan_f32(x, bits, FP16_MAX)
    check_status(rc, name)
    if not math.isfinite(max_abs):
        raise ValueError(f"{name}: contains NaN or Inf")
    return max_abs


def check_tokens_f16(x: np.ndarray, name: str, out: np.ndarray | None = None) -> None:
    """Checks a 3-D float32 or float16 array x (finite, within the fp16 range, as
    as_float_array(fp16_range=True) does) and, given out (float16, x's shape), writes its fp16 rounding
    (float16: x itself) there in the same native pass; on a ValueError out is not written."""
    if _scanned_max_abs(x, name, out) > FP16_MAX:
        raise ValueError(f"{name}: values beyond the fp16 range (|x| > {FP16_MAX:g}) cannot be stored")


def store_tokens(k, v, k_out: np.ndarray, v_out: np.ndarray, checked_on_store: bool) -> None:
    """Writes an append's k, v (already shaped as k_out, v_out: float16 views into a cache's buffers) as
    their fp16 rounding: tokens plain_tokens accepted are checked in the same native pass
    (checked_on_store), any others were checked by check_kv and are assigned."""
    if checked_on_store:
        check_tokens_f16(k, "k", k_out)
        check_tokens_f16(v, "v", v_out)
    else:
        k_out[...] = k
        v_out[...] = v


_F16_CHECK_CHUNK = 1 << 20  # elements per pass over a long contiguous prompt: a bounded temporary


def _f16_all_finite(x: np.ndarray) -> bool:
    """No NaN or Inf in a float16 array: no exponent field of all ones, checked a chunk at a time."""
    if x.size == 0:  # max() of nothing raises
        return True
    if x.size <= _F16_CHECK_CHUNK or not x.flags.c_contiguous:
        # One pass: a decode step's token (the chunk loop's generator cost ~2 us of its ~5), or a
        # strided view (one decode token of [H, n, D], say).
        return bool(np.bitwise_and(x.view(np.uint16), 0x7C00).max() != 0x7C00)
    bits = x.reshape(-1).view(np.uint16)
    step = _F16_CHECK_CHUNK
    return all(np.bitwise_and(bits[i : i + step], 0x7C00).max() != 0x7C00 for i in range(0, bits.size, step))


def tile_cut_point(length: int, sink_len: int, group: int, num_tiles: int) -> int:
    """Of a cache holding sink_len sink tokens then num_tiles quantised tiles of `group` tokens
    (then the tail): ``length`` if its first ``length`` tokens can be kept as they are, else the
    start of the quantised tile that ``length`` would cut (those tokens exist only as codes)."""
    body = length - min(length, sink_len)  # tokens after the sink
    tile, into = divmod(body, group)
    return length - into if tile < num_tiles else length


def check_status(rc: int, what: str) -> None:
    if rc == _native.OK:
        return
    if rc == _native.ERR_ISA:
        raise RuntimeError(f"{what}: no usable ISA: {_native.isa_error()}")
    if rc == _native.ERR_ARGUMENT:
        raise ValueError(f"{what}: the native core rejected its arguments")
    if rc == _native.ERR_OVERFLOW:
        raise ValueError(f"{what}: values too large for the fp16 scales of a tile")
    # KVARN_ERR_INTERNAL: in practice an allocation that failed (the working memory of a call)
    raise MemoryError(f"{what}: the native core could not allocate its working memory or failed internally (status {rc})")


# ---- threads and ISA ---------------------------------------------------------
_num_threads = 0  # 0: all cores


def set_num_threads(n: int) -> None:
    """Default thread count for native calls (0 = all cores)."""
    global _num_threads
    _num_threads = check_positive_int(n, "n", minimum=0, maximum=MAX_THREADS)


def get_num_threads() -> int:
    """Threads the kernels use when a call passes no num_threads (set_num_threads; default all cores)."""
    return _num_threads if _num_threads > 0 else int(_native.default_threads())


def resolve_threads(num_threads: int | None) -> int:
    if num_threads is None:
        return _num_threads
    return check_positive_int(num_threads, "num_threads", minimum=0, maximum=MAX_THREADS)


ISAS = ("scalar", "avx2", "avx512")


def available_isas() -> list[str]:
    """ISAs compiled in and supported by this CPU and OS, lowest first."""
    return [name for name in ISAS if _native.isa_available(name)]


def active_isa() -> str:
    """The kernel table in use: "scalar", "avx2" or "avx512" ("none" when KVARN_ISA names one that cannot run)."""
    return _native.active_isa()


def read_only(buffer: np.ndarray) -> np.ndarray:
    """buffer (C-contiguous) seen through a read-only memoryview: unlike a view with its writeable flag
    cleared, whose flag numpy lets anyone set again, no view of it can be made writeable."""
    if not buffer.flags.c_contiguous:
        raise ValueError("read_only: the buffer must be C-contiguous")
    return np.frombuffer(memoryview(buffer).toreadonly(), buffer.dtype).reshape(buffer.shape)


def check_choice(value, argname: str, choices: tuple, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{argname}: expected a str, one of {list(choices)}; got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{argname}: unknown {what} {value!r}; choose one of {list(choices)}")


def set_isa(name: str) -> None:
    """Selects the kernels used from now on (overrides KVARN_ISA)."""
    check_choice(name, "name", ISAS, "ISA")
    if _native.set_isa(name) != _native.OK:
        raise ValueError(f"name: ISA {name!r} is not available here ({_native.isa_error()})")


SCORE_MODES = ("float", "int16", "int8")


def set_score_mode(mode: str) -> None:
    """How the SIMD kernels compute 4-bit key scores and 2-bit value sums: "int16" (the default:
    int16-rounded query and weights, exact int32 sums; ~1e-4 of the output's scale from the float
    path on typical queries (up to 1.9e-4 on real SmolLM2 ones), more where one rotated query component or
    one token's weight dominates, as both are rounded relative to their largest (8e-3 on a contrived
    query); 1.4-1.8x faster; any AVX2 or AVX-512 CPU, vpdpwssd where it has VNNI), "float" (fp32, equal to
    float64 up to reassociation) or "int8" (the query rounded to int8 and the 2-bit values' weights to uint8
    per tile and head, the 4-bit key codes centred on 7.5 so that most of the query's rounding cancels: 4.6e-3
    of the output on real SmolLM2 queries, ~2e-2 on random data - 2-3 % of the k4v2 quantisation's own error,
    ~0.1 % of its square; ~0.78-0.88x int16's time on one core; runs on avx2
    - vpdpbusd where the CPU has AVX-VNNI, else vpmaddubsw - and on avx512 with VNNI, where an avx512
    CPU without VNNI runs int16 instead). Refused with ValueError on a CPU without AVX2. The scalar
    kernels always run float; score_mode() says what the active kernels run. Also: KVARN_SCORES."""
    check_choice(mode, "mode", SCORE_MODES, "score mode")
    if _native.set_score_mode(mode) != _native.OK:
        raise ValueError(f"mode: {mode!r} needs AVX2, which this CPU/build lacks")


def score_mode() -> str:
    """The score mode the active kernels run (see set_score_mode: "float" on the scalar
    kernels, "int16" for an "int8" request on avx512 without VNNI)."""
    return _native.score_mode()


def _check_environment() -> None:
    if _native.active_isa() == "none":
        raise RuntimeError(
            f"{_native.isa_error()}; unset KVARN_ISA or set it to one of {available_isas()}"
        )
    forced = os.environ.get("KVARN_SCORES", "")
    if forced and forced not in SCORE_MODES:
        raise RuntimeError(f"KVARN_SCORES={forced!r} is not a score mode; unset it or use one of {list(SCORE_MODES)}")


_check_environment()


# ---- Hadamard ------------------------------------------------------------------
def hadamard(x: ArrayLike) -> np.ndarray:
    """Orthonormal fast Walsh-Hadamard transform along the last axis.

    Block-diagonal when head_dim is not a power of two: the block is the
    largest power of two dividing it (SPEC §2). Its own inverse. float16 and
    float32 inputs give float32, float64 gives float64; a result beyond
    that dtype's range (input near its maximum) raises ValueError.
    """
    x, max_abs = as_float_array(x, "x", with_max_abs=True)
    if x.ndim == 0:
        raise ValueError("x: expected at least a 1-D array")
    head_dim = check_head_dim(x.shape[-1], "x.shape[-1]")
    out_dtype = np.float64 if x.dtype == np.float64 else np.float32
    out = np.array(x, dtype=out_dtype, order="C", copy=True).reshape(-1, head_dim)
    if out.shape[0] == 0:  # no rows: nothing to transform (numpy's convention for empty batches)
        return out.reshape(x.shape)
    if out_dtype == np.float64:
        rc = _native.hadamard_f64(out, head_dim)
    else:
        rc = _native.hadamard_f32(out, head_dim)
    check_status(rc, "hadamard")
    # The unnormalised butterflies grow a row by up to `block` times its max |x|; only then can the
    # result overflow, so only then is it scanned.
    block = head_dim & -head_dim
    if max_abs * block > float(np.finfo(out_dtype).max) and not np.isfinite(out).all():
        raise ValueError(f"x: values up to {max_abs:.3g} overflow the {np.dtype(out_dtype).name} transform "
                         f"(blocks of {block}); scale x down")
    return out.reshape(x.shape)


def quantize_tiles_native(k3: np.ndarray, v3: np.ndarray, preset: Preset, iters: int, num_threads,
                          describe=lambda i: f"tile {i}", *, out=None, round_to_f16: bool = False) -> np.ndarray:
    """k3, v3: C-contiguous [n, G, D], float32, or float16 (converted tile by tile in the native
    code, no float32 copy here) -> records uint8 [n, record_bytes], into out when given.
    round_to_f16: float32 values are rounded to fp16 first (what a cache storing fp16 quantises).
    describe(i) names pair i in the error raised when its scales overflow fp16."""
    n, _, head_dim = k3.shape
    # The native code refuses misaligned buffers (a user's array read from a byte buffer, say): copy those.
    if not k3.flags.aligned:
        k3 = k3.copy()
    if not v3.flags.aligned:
        v3 = v3.copy()
    records = np.empty((n, preset.record_bytes(head_dim)), dtype=np.uint8) if out is None else out
    threads = resolve_threads(num_threads)
    if k3.dtype == np.float16:
        rc, bad = _native.quantize_tiles_f16(k3.view(np.uint16), v3.view(np.uint16), preset.kbits, preset.vbits, iters,
                                             records, threads)
    else:
        rc, bad = _native.quantize_tiles(k3, v3, preset.kbits, preset.vbits, iters, records, threads, round_to_f16)
    if rc == _native.ERR_OVERFLOW:
        pair = [x[bad].astype(np.float16 if round_to_f16 else x.dtype).astype(np.float32) for x in (k3, v3)]
        raise ValueError(
            f"{_overflowing(*pair, preset, iters)}: {describe(bad)} has values too large for its fp16 "
            "scale vectors after rotation; keep |k|, |v| well inside the fp16 range"
        )
    check_status(rc, "quantize")
    return records


def _overflowing(k2, v2, preset: Preset, iters: int) -> str:
    """Which of one record's k, v overflows its fp16 scales: each quantised again beside zeros
    (an error path only)."""
    zeros = np.zeros((1, *k2.shape), np.float32)
    out = np.empty((1, preset.record_bytes(k2.shape[-1])), np.uint8)
    names = [name for name, pair in (("k", (k2[None], zeros)), ("v", (zeros, v2[None])))
             if _native.quantize_tiles(*pair, preset.kbits, preset.vbits, iters, out, 1)[0] == _native.ERR_OVERFLOW]
    return " and ".join(names) or "k/v"


def dequantize_records_native(records: np.ndarray, preset: Preset, head_dim: int):
    n = records.shape[0]
    k = np.empty((n, preset.group, head_dim), dtype=np.float32)
    v = np.empty_like(k)
    rc = _native.dequantize_tiles(np.ascontiguousarray(records), preset.kbits, preset.vbits, k, v)
    check_status(rc, "dequantize")
    return k, v


def balance_scales(x, iters: int = SINKHORN_ITERS):
    """SPEC §3 row and column scales (r, c) of a 2-D matrix, as the quantiser computes them."""
    x = as_float_array(x, "x", ndim=2)
    if x.shape[0] < 2 or x.shape[1] < 2:
        raise ValueError(f"x: needs at least 2 rows and 2 columns, got shape {x.shape}")
    iters = check_iters(iters)
    x32 = np.require(x, np.float32, ("C", "A"))
    r = np.empty(x.shape[0], np.float32)
    c = np.empty(x.shape[1], np.float32)
    check_status(_native.balance(x32, iters, r, c), "balance_scales")
    return r, c


# ---- shared by KVCache and FP16Cache ----------------------------------------------------------
_OWN_ATTRIBUTES = {}  # cache class -> the instance attributes a fresh one sets (built on first use)


# Caches whose append lock a fork()ed child renews, by id (a WeakSet would need them hashable: a subclass
# that defines __eq__ alone is not); an entry leaves when its cache is freed.
_LOCK_HOLDERS = weakref.WeakValueDictionary()


# The arguments of _native.CacheView, in order: what KVCache / FP16Cache._view_args return for a state.
VIEW_FIELDS = ("num_kv_heads", "head_dim", "group", "kbits", "vbits", "sink_k", "sink_v", "sink_len", "records",
               "num_tiles", "tail_k", "tail_v", "tail_len")


def native_view(cache) -> Any:
    """The _native.CacheView of cache's current state (cache._state, one snapshot), built once per state from
    cache._view_args(state): a decode loop attends far more often than it appends. The (state, view) pair is one
    attribute (_parts_cache), so a reader never pairs a view with another state."""
    state = cache._state
    cached = cache.__dict__.get("_parts_cache")
    if cached is not None and cached[0] is state:
        return cached[1]
    view = _native.CacheView(*cache._view_args(state))
    cache._parts_cache = (state, view)
    return view


def native_parts(cache) -> dict:
    """cache's current state as a dict of VIEW_FIELDS (fp16 arrays as their uint16 bits), the form
    _native.attend also takes: for tests and inspection, which edit it (attend uses native_view)."""
    parts = dict(zip(VIEW_FIELDS, cache._view_args(cache._state)))
    for key in ("sink_k", "sink_v", "tail_k", "tail_v"):
        parts[key] = parts[key].view(np.uint16)
    return parts


def new_append_lock(cache) -> threading.Lock:
    """A fresh lock for cache's writers, renewed in a fork()ed child: a fork while another thread held it
    (inside an append) left it held forever there, so the child's first append on that cache hung."""
    _LOCK_HOLDERS[id(cache)] = cache
    return threading.Lock()


def _renew_append_locks() -> None:
    for cache in list(_LOCK_HOLDERS.values()):  # the child's only thread: the writer that held a lock is gone
        cache._append_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_append_locks)


def extra_attributes(obj, base) -> list:
    """Names of obj's instance attributes beyond what a fresh base(1, 16) sets (a subclass's, say):
    what a copy or a pickle must carry besides the cache's own state."""
    own = _OWN_ATTRIBUTES.get(base)
    if own is None:
        own = _OWN_ATTRIBUTES[base] = frozenset(base(1, 16).__dict__) | {"_parts_cache"}
    return [k for k in obj.__dict__.copy() if k not in own]  # a snapshot: attend adds _parts_cache meanwhile


def check_kv(k, v, num_kv_heads: int, head_dim: int):
    """Checks one append's k, v: [num_kv_heads, n, head_dim], float, finite, inside the fp16 range."""
    k = as_float_array(k, "k", ndim=3, fp16_range=True)
    v = as_float_array(v, "v", ndim=3, fp16_range=True)
    if k.shape[0] != num_kv_heads or k.shape[2] != head_dim:
        raise ValueError(
            f"k: expected shape [{num_kv_heads}, n, {head_dim}] (num_kv_heads, tokens, head_dim), got {k.shape}"
        )
    if v.shape != k.shape:
        raise ValueError(f"v: shape {v.shape} does not match k's {k.shape}")
    return k, v


def check_queries(q, num_kv_heads: int, head_dim: int, ndim: int, scale: float, name: str = "q"):
    """Checks queries [..., Hq, head_dim] against a cache, and that q * scale cannot overflow the
    float32 scores over keys of L2 norm below sqrt(head_dim) * 2**17 (|q . k| <= ||q|| ||k||):
    fp16 keys are, and decoded ones from real data are far below; extreme inputs or imported
    records can go beyond (see cache.check_key_norms), where the CPU kernels report the overflow
    and the GPU cache refuses such keys. Also that q itself fits float32, which the kernels read."""
    q, max_abs = as_float_array(q, name, ndim=ndim, with_max_abs=True)
    limit = FLOAT32_MAX / (head_dim * 2.0**17)
    if max_abs * abs(scale) > limit:
        raise ValueError(
            f"{name}: max |{name}| x |scale| = {max_abs * abs(scale):.3g} could overflow the float32 attention "
            f"scores (limit {limit:.3g} at head_dim {head_dim}); scale the queries down"
        )
    if max_abs > FLOAT32_MAX:  # float64 (a tiny scale passes the check above): the cast would make it inf
        raise ValueError(f"{name}: values beyond the float32 range (max |{name}| = {max_abs:.3g}) cannot be attended; "
                         "scale the queries down")
    if q.shape[-1] != head_dim:
        raise ValueError(f"{name}: last dimension {q.shape[-1]} does not match the cache's head_dim {head_dim}")
    hq = q.shape[-2]
    if hq == 0 or hq % num_kv_heads:
        raise ValueError(f"{name}: {hq} query heads is not a positive multiple of the cache's {num_kv_heads} kv heads")
    return q


def check_step_queries(q, num_kv_heads: int, head_dim: int, scale: float) -> np.ndarray:
    """check_queries for a model's step queries [B, Hq, n, D] (transformers' layout), returned as [B, n, Hq, D]
    (append_attend_chunks' layout). A one-token step is checked as [B, Hq, D]: the transposed view's check
    copies it, 3.5-5 us per layer and decode step."""
    if q.shape[2] == 1:
        return check_queries(q[:, :, 0], num_kv_heads, head_dim, ndim=3, scale=scale)[:, None]
    return check_queries(q.transpose(0, 2, 1, 3), num_kv_heads, head_dim, ndim=4, scale=scale)


def check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale: expected a float, got {type(scale).__name__}")
    try:
        scale = float(scale)
    except OverflowError:  # a Python int beyond any float
        raise ValueError("scale: an int this large is beyond the float32 range the kernels compute in") from None
    if not math.isfinite(scale):
        raise ValueError("scale: must be finite")
    if abs(scale) > FLOAT32_MAX:
        raise ValueError(f"scale: {scale:g} is beyond the float32 range the kernels compute in")
    return scale


def check_caches(caches, cache_type, allow_empty: bool) -> None:
    """A batch's caches: a non-empty list of cache_type with equal heads and head_dim (and tokens
    unless allow_empty)."""
    type_name = cache_type.__name__
    if not isinstance(caches, (list, tuple)):
        raise TypeError(f"caches: expected a list of kvarn.{type_name}, got {type(caches).__name__}")
    if not caches:
        raise ValueError(f"caches: expected at least one kvarn.{type_name}, got an empty {type(caches).__name__}")
    for i, c in enumerate(caches):
        if not isinstance(c, cache_type):
            raise TypeError(f"caches[{i}]: expected a kvarn.{type_name}, got {type(c).__name__}")
    first = caches[0]
    for i, c in enumerate(caches):
        if c.num_kv_heads != first.num_kv_heads or c.head_dim != first.head_dim:
            raise ValueError(
                f"caches[{i}]: {c.num_kv_heads} kv heads x {c.head_dim} does not match caches[0]'s "
                f"{first.num_kv_heads} x {first.head_dim}"
            )
        if not allow_empty and len(c) == 0:
            raise ValueError(f"caches[{i}]: the cache is empty; append tokens before attending")


def attend_caches(q, caches, cache_type, scale, num_threads) -> np.ndarray:
    """Validates a batch (q [B, Hq, D], B caches of cache_type with equal heads and head_dim, none
    empty) and runs the native decode attention over all of them in one call."""
    check_caches(caches, cache_type, allow_empty=False)
    first = caches[0]
    scale = check_scale(scale, first.head_dim)
    q = check_queries(q, first.num_kv_heads, first.head_dim, ndim=3, scale=scale)
    if q.shape[0] != len(caches):
        raise ValueError(f"q: batch of {q.shape[0]} queries for {len(caches)} caches")
    return run_attend(q, caches, scale, num_threads)


def attend_one(q, cache, cache_type, scale, num_threads) -> np.ndarray:
    """attend_caches for one cache and q [Hq, D], validated once (a decode loop's hot path)."""
    if not isinstance(cache, cache_type):
        raise TypeError(f"cache: expected a kvarn.{cache_type.__name__}, got {type(cache).__name__}")
    if len(cache) == 0:
        raise ValueError("cache: the cache is empty; append tokens before attending")
    scale = check_scale(scale, cache.head_dim)
    q = check_queries(q, cache.num_kv_heads, cache.head_dim, ndim=2, scale=scale)
    return run_attend(q[None], [cache], scale, num_threads, ["cache"])[0]


def append_attend_caches(q, caches, k, v, cache_type, scale, num_threads, single=False) -> np.ndarray:
    """Appends each sequence's n new tokens (k[b], v[b]: [Hk, n, D]) to caches[b] and returns the
    queries' attention (q [B, n, Hq, D] -> float32, the same shape), token i's over its cache up to
    and including token i: what appending the tokens one at a time and attending after each gives.
    The tokens go in chunks that complete no tile, each attended causally in one native call (its
    records read once for all its tokens); a token that completes a tile is attended alone after it.
    All or nothing: a refused token or query rolls every cache back to where it was. single: one
    cache, q [n, Hq, D], k and v [Hk, n, D] (the result [n, Hq, D])."""
    if single:
        if not isinstance(caches, cache_type):
            raise TypeError(f"cache: expected a kvarn.{cache_type.__name__}, got {type(caches).__name__}")
        if _one_cache_step(q, caches, k, v):
            return _append_attend_one_cache(q, caches, k, v, scale, num_threads, "cache")
        caches, names = [caches], ["cache"]
    else:
        # One sequence (a batch API called for one, as the fp16 baseline's steps are): the same path.
        if (isinstance(caches, (list, tuple)) and len(caches) == 1 and isinstance(caches[0], cache_type)
                and isinstance(q, np.ndarray) and q.ndim == 4 and isinstance(k, (np.ndarray, list, tuple))
                and isinstance(v, (np.ndarray, list, tuple)) and len(k) == 1 and len(v) == 1
                and _one_cache_step(q[0], caches[0], k[0], v[0])):
            return _append_attend_one_cache(q[0], caches[0], k[0], v[0], scale, num_threads, "caches[0]")[None]
        check_caches(caches, cache_type, allow_empty=True)
        names = None
    first = caches[0]
    B, Hk, D = len(caches), first.num_kv_heads, first.head_dim
    scale = check_scale(scale, D)
    q = check_queries(q, Hk, D, ndim=3 if single else 4, scale=scale)
    if single:
        q, k, v = q[None], [k], [v]
    elif q.shape[0] != B:
        raise ValueError(f"q: batch of {q.shape[0]} sequences' queries for {B} caches")
    for name, x in (("k", k), ("v", v)):
        if not hasattr(x, "__len__") or isinstance(x, (str, bytes)):
            raise TypeError(f"{name}: expected the sequences' tokens, [B, Hk, n, D] or B arrays [Hk, n, D], got "
                            f"{type(x).__name__}")
    if len(k) != B or len(v) != B:  # k[b], v[b] are each cache's to append (checked there)
        raise ValueError(f"k, v: {len(k)} and {len(v)} sequences' tokens for {B} caches")
    n, Hq = q.shape[1], q.shape[2]
    stacked = (B, Hk, n, D)  # k, v as one array each: no per-row look (~1 us a row)
    if _shaped(k, stacked) and _shaped(v, stacked):
        shapes = None
    else:
        # Rows as arrays (nested lists, say, as append takes them; unreadable ones refused by name): the
        # chunks below slice them.
        k, v = ([x if isinstance(x, np.ndarray) else _plain_float_array(x, name) for x in rows]
                for name, rows in (("k", k), ("v", v)))
        shapes = {x.shape for x in k + v}
    if shapes is not None and shapes != {(Hk, n, D)}:
        what = "" if single else "each sequence's "
        raise ValueError(f"k, v: {what}tokens must be [{Hk}, {n}, {D}] (kv heads, q's {n} tokens, head_dim), "
                         f"got {', '.join(str(tuple(x)) for x in sorted(shapes))}")
    out = np.empty((B, n, Hq, D), np.float32)
    if len({id(c) for c in caches}) != B:
        raise ValueError("caches: a cache appears twice (each sequence's tokens go to its own cache)")
    if n == 0:
        return out[0] if single else out

    def row_error(b, error):
        return error if B == 1 else ValueError(f"sequence {b} ({_cache_name(names, b)}): {error}")

    _undoable(caches, lambda: append_attend_chunks(q, caches, k, v, scale, num_threads, out, row_error, names,
                                                   locked=True))
    return out[0] if single else out


def _undoable(caches, step):
    """step()'s result, run holding every cache's append lock; if it raises, every cache is undone to where it
    was. The step is several appends: the locks are held throughout (taken in one global order, so that two
    steps over shared caches cannot deadlock), so that no other writer comes between them, and an undo cannot
    take another thread's append with it. Attends by others read published states. (Taken and released in a
    plain loop: an ExitStack cost ~1 us a cache.)"""
    taken = []
    try:
        for c in sorted(caches, key=id):
            c._append_lock.acquire()
            taken.append(c._append_lock)
        points = [c._undo_point() for c in caches]
        try:
            return step()
        except BaseException:
            for c, point in zip(caches, points):
                c._undo_locked(point)
            raise
    finally:
        for lock in reversed(taken):
            lock.release()


def _shaped(x, shape) -> bool:
    return isinstance(x, np.ndarray) and x.shape == shape


def _one_cache_step(q, cache, k, v) -> bool:
    """Whether a step is on one cache with arrays throughout: q [n, Hq, D] (n >= 1) and k, v [Hk, n, D] of the
    cache's heads and head_dim (anything else takes the general path, whose checks name what is wrong)."""
    if not (isinstance(q, np.ndarray) and q.ndim == 3 and q.shape[0] >= 1):
        return False
    shape = (cache.num_kv_heads, q.shape[0], cache.head_dim)
    return isinstance(k, np.ndarray) and isinstance(v, np.ndarray) and k.shape == shape and v.shape == shape


def _append_attend_one_cache(q, cache, k, v, scale, num_threads, name: str) -> np.ndarray:
    """append_attend_caches for _one_cache_step's case (name: what errors call the cache): the same checks in
    the same order (scale, q, then append's of k and v), the same chunks, errors and undo as the general path,
    without its bookkeeping for several caches: 15-26 us a one-token step on the 2-vCPU box, as much as the
    native call at short contexts, and a few us a step of 2-4 tokens (RESULTS, section 2, sixty-second session)."""
    D = cache.head_dim
    scale = check_scale(scale, D)
    q = check_queries(q, cache.num_kv_heads, D, ndim=3, scale=scale)
    if q.shape[0] == 1:
        # The decode loop's step: one append and one native call, _undoable's work inline (at 1K the chunk loop
        # cost ~8 us more, _undoable's generality ~4 us: results/emr2c_s102/mend_{chunks_,}ab.log).
        with cache._append_lock:
            point = cache._undo_point()
            try:
                cache._append_locked(k, v, num_threads)
                return run_attend(q, [cache], scale, num_threads, [name])
            except BaseException:
                cache._undo_locked(point)
                raise
    out = np.empty((1, *q.shape), np.float32)
    _undoable([cache], lambda: append_attend_chunks(q[None], [cache], [k], [v], scale, num_threads, out, _same_error,
                                                    [name], locked=True))
    return out[0]


def _same_error(b, error):  # row_error for one cache: its errors as they are
    return error


def append_attend_chunks(q, caches, k, v, scale: float, num_threads, out, row_error, names=None,
                         locked: bool = False) -> None:
    """append_attend_caches' steps, with nothing undone on an error (the caller's part): q [B, n, Hq, D]
    checked, k[b] and v[b] [Hk, n, D] (append checks them; row_error(b, error) makes the error raised
    for row b's), out [B, n, Hq, D] float32 written. locked: the caller holds every cache's append lock."""
    B, n, Hq, D = q.shape
    pos = 0
    while pos < n:
        # 0 free: the next token completes a tile (or, quantize_on="next", makes the full tail one): alone
        m = 1 if pos == n - 1 else max(1, min(n - pos, min(c._tokens_before_quantising() for c in caches)))
        whole = m == n  # the step in one chunk: each row's tokens as given, no slice
        for b, c in enumerate(caches):
            append = c._append_locked if locked else c.append
            try:
                if whole:
                    append(k[b], v[b], num_threads=num_threads)
                else:
                    append(k[b][:, pos : pos + m], v[b][:, pos : pos + m], num_threads=num_threads)
            except ValueError as error:
                raise row_error(b, error) from error
        if m == 1:  # one token: the plain call, writing out's row itself where it is contiguous (one sequence or one token)
            row = out[:, pos]
            got = run_attend(q[:, pos], caches, scale, num_threads, names, out=row)
            if got is not row:
                row[...] = got
        else:
            rows = np.ascontiguousarray(q[:, pos : pos + m]).reshape(B, m * Hq, D)
            out[:, pos : pos + m] = run_attend(rows, caches, scale, num_threads, names, n_tokens=m).reshape(B, m, Hq, D)
        pos += m


def _cache_name(names, i: int) -> str:
    return f"caches[{i}]" if names is None else names[i]


def run_attend(q, caches, scale: float, num_threads, names=None, n_tokens: int = 1, out=None) -> np.ndarray:
    """The native call for validated queries [B, n_tokens * Hq, D] (each sequence's last n_tokens
    tokens', token-major, attending causally) and caches (names: what errors call them, by default
    caches[i]). out: a C-contiguous float32 array of q's shape to write (a new one by default), left
    undefined where the call raises."""
    q32 = np.ascontiguousarray(q, np.float32)
    if not q32.flags.aligned:  # refused by the native code; np.require would cost ~2 us on every call
        q32 = q32.copy()
    if out is None or not (out.dtype is F32 and out.shape == q32.shape and out.flags.c_contiguous and out.flags.aligned):
        out = np.empty_like(q32)
    views = [native_view(c) for c in caches]  # the snapshots attended
    for i, view in enumerate(views):
        if view.empty:  # emptied (truncated) by another thread
            raise ValueError(f"{_cache_name(names, i)}: the cache is empty; append tokens before attending")
    rc = _native.attend(views, q32, scale, out, resolve_threads(num_threads), n_tokens)
    # check_queries bounds q * scale for keys below the norm real data stays far under; keys decoded
    # from extreme inputs or imported records can exceed it, and then the native call reports a
    # non-finite output (its merge checks each row: free, where a numpy scan cost 3-10 % of a call).
    if rc == _native.ERR_OVERFLOW:
        bad = [_cache_name(names, i) for i, o in enumerate(out) if not np.isfinite(o).all()]
        raise ValueError(
            f"q: the attention scores or outputs overflowed float32 for these queries and {', '.join(bad)}; "
            "scale the queries down"
        )
    check_status(rc, "attend")
    return out
