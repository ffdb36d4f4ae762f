"""KVarN on the GPU: a paged k4v2 (and other presets) KV cache with fused decode attention.

    import torch, kvarn.cuda
    cache = kvarn.cuda.PagedKVCache(num_kv_heads=8, head_dim=128, max_seqs=32, max_seq_len=32768)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append([a, b], k, v)              # k, v: [B, T, Hk, D] (or [B, Hk, D]) bf16/fp16/fp32 CUDA
    out = cache.attend(q, [a, b])           # q: [B, Hq, D] -> [B, Hq, D], q's dtype and library
    out_n = cache.append_attend(q_n, [a, b], k_n, v_n)  # n new tokens each: q_n [B, n, Hq, D], k_n/v_n
                                            # [B, n, Hk, D] -> [B, n, Hq, D]; token i sees up to token i
    c = cache.fork(b)                       # a new sequence holding b's tokens (pages shared, copied on write)
    point = cache.checkpoint([a, b], 1)     # before a step; rollback(point) undoes its appends (tiles too) exactly
    cache.free(a)

Tensors are taken and returned without host copies: torch CUDA tensors directly,
anything else through ``__cuda_array_interface__`` (CuPy, Numba, ...). The
kernels live in the separate extension ``kvarn._cuda``; ``import kvarn`` works
without it, and every GPU entry point raises a clear RuntimeError when it is
missing or no GPU is visible. Maths and record bytes are SPEC.md's: a record
written here decodes on the CPU path and vice versa (see ``to_cpu`` / ``load_cpu``).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from ._ops import (DEFAULT_PRESET, FLOAT32_MAX, SINKHORN_ITERS, check_iters, check_positive_int, check_scale, get_preset,
                   read_only, tile_cut_point)

if TYPE_CHECKING:  # annotations only
    from ._ops import PresetLike

try:  # the CUDA module is optional at build time
    from . import _cuda
    _IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - depends on the build
    _cuda = None
    _IMPORT_ERROR = exc

__all__ = ["DeviceArray", "PagedKVCache", "flags_error", "is_available", "quantize_tiles", "unavailable_reason",
           "GPU_HEAD_DIMS"]

GPU_HEAD_DIMS = (64, 128, 256)
FP16_MAX = 65504.0
_DTYPE_NAMES = {0: "float32", 1: "float16", 2: "bfloat16"}
_DTYPE_BYTES = {0: 4, 1: 2, 2: 2}
MAX_GRID_YZ = 65535  # CUDA's limit on a launch grid's y and z dimensions
MAX_ATTEND_BATCH = MAX_GRID_YZ  # sequences per attend: the batch is a grid dimension
# append_attend's one-token steps of up to this many rows work out their metadata in Python ints (_decode_rows);
# beyond, numpy's fixed per-call costs win (host time against the general path: 0.82x at 32 rows, 1.04x at 64;
# RESULTS §3, s97)
_DECODE_ROWS = 32
# The checking kernel's bits for q: above k's and v's (FLAG_*), so that one flag word holds all three.
_Q_NONFINITE, _Q_RANGE = 1 << 8, 1 << 9


# ---- availability -------------------------------------------------------------
def unavailable_reason(device: int | None = None):
    """None when the GPU path can run here, on cuda:``device`` (default: the current device), else a
    sentence saying why not."""
    if _cuda is None:
        return (
            f"kvarn was built without its CUDA module (kvarn._cuda: {_IMPORT_ERROR}); "
            "rebuild on a machine with nvcc (KVARN_CUDA=ON pip install .)"
        )
    rc, n = _cuda.device_count()
    if rc != _cuda.OK or n == 0:
        error = _cuda.last_error() or "device count 0"
        if "InsufficientDriver" in error:  # also what the runtime says when there is no driver at all
            error += "; no NVIDIA driver is loaded, or it is older than the CUDA runtime kvarn was built with"
        return f"no CUDA device is visible ({error})"
    if device is not None:
        if not 0 <= device < n:
            return f"cuda:{device} is not visible here ({n} device(s))"
        return _unsupported_device(device)
    rc, device = _cuda.get_device()
    if rc != _cuda.OK:
        return f"the current CUDA device cannot be read ({_cuda.last_error()})"
    return _unsupported_device(device)


MIN_COMPUTE_CAPABILITY = (9, 0)  # sm_90a machine code + compute_90 PTX; the kernels use clusters (Hopper+)


def _unsupported_device(device: int):
    """None when cuda:device can run the kernels, else why not."""
    rc, props = _cuda.device_props(device)
    if rc != _cuda.OK:
        return f"the properties of cuda:{device} cannot be read ({_cuda.last_error()})"
    cc = (int(props["major"]), int(props["minor"]))
    if cc < MIN_COMPUTE_CAPABILITY:
        return (f"cuda:{device} has compute capability {cc[0]}.{cc[1]}; kvarn's CUDA kernels need "
                f"{MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} (Hopper) or later")
    return None


def is_available(device: int | None = None) -> bool:
    """Whether the GPU path can run on cuda:``device`` (default: the current device)."""
    return unavailable_reason(device) is None


def _require(device=None):
    reason = unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(f"kvarn.cuda: {reason}")


def _check(rc, what):
    if rc == 0:
        return
    if rc == _cuda.ERR_ARGUMENT:
        raise ValueError(f"{what}: the CUDA kernels rejected their arguments")
    raise RuntimeError(f"{what}: CUDA error: {_cuda.last_error()}")


def _check_stream(stream, name="stream"):
    """A cudaStream_t handle as an int (0: the legacy default stream)."""
    if isinstance(stream, (bool, np.bool_)) or not isinstance(stream, (int, np.integer)):
        raise TypeError(f"{name}: expected a cudaStream_t handle as an int (torch: stream.cuda_stream, CuPy: "
                        f"stream.ptr), got {type(stream).__name__}")
    if not 0 <= stream < 2**64:
        raise ValueError(f"{name}: {stream} is not a cudaStream_t handle")
    return int(stream)


class _OwnsDeviceResources:
    """Holds raw device pointers or handles that it frees when collected: a copy or an unpickled
    twin would share them and free them twice (or, in another process, point at nothing)."""

    _copy_instead = ""

    def _refuse_copy(self, *args):
        raise TypeError(f"{type(self).__name__}: cannot be copied or pickled (it owns GPU memory that a copy "
                        f"would share and free twice){self._copy_instead}")

    __copy__ = __deepcopy__ = __reduce_ex__ = __reduce__ = _refuse_copy


# ---- device arrays ------------------------------------------------------------------
class DeviceArray(_OwnsDeviceResources):
    """A cudaMalloc'd buffer owned by kvarn, exported through ``__cuda_array_interface__``
    (so ``torch.as_tensor(a, device='cuda')`` and ``cupy.asarray(a)`` wrap it without a copy).
    ``stream``: the stream of kvarn's last write to it (from_numpy, zero_, a result of attend or
    quantize_tiles), exported so that a consumer orders itself after it; not cleared when the write
    completes (ordering after finished work costs nothing). None: kvarn never wrote it."""

    _TYPESTR = {np.dtype(np.uint8): "|u1", np.dtype(np.int32): "<i4", np.dtype(np.float32): "<f4",
                np.dtype(np.float16): "<f2"}
    _copy_instead = "; copy its data through to_numpy() and from_numpy(), or wrap it with torch or CuPy"

    def __init__(self, shape, dtype):
        dtype = np.dtype(dtype)
        if dtype not in self._TYPESTR:
            raise TypeError(f"dtype: {dtype} is not supported; use one of "
                            f"{', '.join(str(d) for d in self._TYPESTR)}")
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"shape: negative extent in {shape}")
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a numpy product would wrap
        if nbytes >= 2**63:
            raise MemoryError(f"DeviceArray: {nbytes} bytes is more than any GPU holds")
        _require()
        rc, self.device = _cuda.get_device()  # where it lives: tensors on another GPU are refused by the kernels
        _check(rc, "DeviceArray")
        self.shape, self.dtype, self.nbytes = shape, dtype, nbytes
        rc, ptr = _cuda.malloc(self.nbytes)
        if rc and "cudaErrorMemoryAllocation" in _cuda.last_error():
            raise MemoryError(f"DeviceArray: allocating {self.nbytes} bytes: out of GPU memory")
        _check(rc, f"DeviceArray: allocating {self.nbytes} bytes")
        self.ptr = ptr
        self.stream = None

    def __del__(self):
        ptr = getattr(self, "ptr", 0)
        if ptr and _cuda is not None:
            _cuda.free(ptr)
            self.ptr = 0

    @property
    def __cuda_array_interface__(self):
        # The interface's stream 1 is the legacy default stream (its 0 is not allowed).
        stream = None if self.stream is None else (1 if self.stream == 0 else self.stream)
        return {"shape": self.shape, "typestr": self._TYPESTR[self.dtype], "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": stream}

    @classmethod
    def from_numpy(cls, arr, stream=0):
        stream = _check_stream(stream)
        arr = np.ascontiguousarray(arr)
        out = cls(arr.shape, arr.dtype)
        _check(_cuda.memcpy_htod(out.ptr, arr.reshape(-1).view(np.uint8), stream), "DeviceArray.from_numpy")
        out.stream = stream
        return out

    def _stream_or_own(self, stream):
        # Default: the stream of kvarn's last write, so that a read or write orders itself after it.
        return (0 if self.stream is None else self.stream) if stream is None else _check_stream(stream)

    def to_numpy(self, stream=None):
        """Host copy, on ``stream`` (default: the stream of kvarn's last write to the array)."""
        stream = self._stream_or_own(stream)
        out = np.empty(self.shape, self.dtype)
        _check(_cuda.memcpy_dtoh(out.reshape(-1).view(np.uint8), self.ptr, stream), "DeviceArray.to_numpy")
        return out

    def zero_(self, stream=None):
        """Zeroes the array on ``stream`` (default: the stream of kvarn's last write to the array)."""
        stream = self._stream_or_own(stream)
        _check(_cuda.memset(self.ptr, 0, self.nbytes, stream), "DeviceArray.zero_")
        self.stream = stream
        return self


class _View:
    """What the kernels need of one strided device tensor."""

    # stream: where a call on this array runs; producer: the stream whose queued work must finish before
    # kvarn reads or writes it (None: the interface says no wait is needed).
    __slots__ = ("obj", "kind", "ptr", "dtype", "shape", "strides", "stream", "producer", "device", "readonly",
                 "shape0", "name")

    def spec(self):
        return (self.ptr, self.dtype, self.shape, self.strides)

    def extent(self):
        """[first, last] element offsets (from ptr) the view can touch; None when it holds nothing."""
        lo = hi = 0  # one plain loop: this runs on every attend call
        for n, st in zip(self.shape, self.strides):
            if n == 0:
                return None
            if st < 0:
                lo += (n - 1) * st
            else:
                hi += (n - 1) * st
        return lo, hi

    def byte_range(self):
        e = self.extent()
        if e is None:
            return None
        item = _DTYPE_BYTES[self.dtype]
        return self.ptr + e[0] * item, self.ptr + (e[1] + 1) * item

    def max_abs(self, stream):
        """max |x| over the view, read back to the host (an error path only: copies the view's span)."""
        e = self.extent()
        if e is None:
            return 0.0
        item = _DTYPE_BYTES[self.dtype]
        n = e[1] - e[0] + 1
        buf = np.empty(n * item, np.uint8)
        _check(_cuda.memcpy_dtoh(buf, self.ptr + e[0] * item, stream), "max_abs")
        if self.dtype == 0:
            flat = buf.view(np.float32)
        elif self.dtype == 1:
            flat = buf.view(np.float16)
        else:  # bfloat16: the upper half of a float32
            flat = (buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        x = np.lib.stride_tricks.as_strided(flat[-e[0]:], self.shape, [s * flat.itemsize for s in self.strides])
        return float(np.max(np.abs(x.astype(np.float64))))


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_cuda")


def _torch_stream(torch, device_index) -> int:
    """The cudaStream_t of torch's current stream on a device. torch._C._cuda_getCurrentRawStream
    (the accessor Triton uses) costs ~0.5 us; current_stream(device).cuda_stream, the public way
    and the fallback, ~6.5 us - paid for every tensor of every call."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device_index))
    return torch.cuda.current_stream(device_index).cuda_stream


def _view(x, name) -> _View:
    """Describes a GPU tensor without copying it; TypeError naming `name` for anything else."""
    v = _View()
    v.obj, v.name = x, name
    v.readonly = False
    if _is_torch(x):
        import torch

        if not x.is_cuda:
            raise TypeError(f"{name}: expected a CUDA tensor, got one on {x.device}")
        codes = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
        if x.dtype not in codes:
            raise TypeError(f"{name}: dtype {x.dtype} is not supported; use bfloat16, float16 or float32")
        v.kind, v.ptr, v.dtype = "torch", x.data_ptr(), codes[x.dtype]
        v.shape, v.strides = tuple(x.shape), tuple(x.stride())
        v.shape0 = v.shape
        _check_aligned(v, name)
        v.device = x.device.index
        v.stream = v.producer = _torch_stream(torch, v.device)
        return v
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(
            f"{name}: expected a torch CUDA tensor or a GPU array with __cuda_array_interface__ (CuPy), "
            f"got {type(x).__name__}"
        )
    typestr = cai["typestr"]
    codes = {"<f4": 0, "<f2": 1}
    if typestr not in codes:
        raise TypeError(f"{name}: dtype {typestr} is not supported; use float16 or float32 (bfloat16 via torch)")
    if cai.get("mask") is not None:
        raise TypeError(f"{name}: masked arrays are not supported")
    v.dtype = codes[typestr]
    v.shape = tuple(int(s) for s in cai["shape"])
    v.shape0 = v.shape
    if len(v.shape) > 4:
        raise ValueError(f"{name}: at most 4 dimensions, got shape {v.shape}")
    item = _DTYPE_BYTES[v.dtype]
    if cai.get("strides") is None:
        strides, acc = [], 1
        for s in reversed(v.shape):
            strides.append(acc)
            acc *= s
        v.strides = tuple(reversed(strides))
    else:
        if any(s % item for s in cai["strides"]):
            raise ValueError(f"{name}: strides must be whole elements")
        if len(cai["strides"]) != len(v.shape):
            raise ValueError(f"{name}: {len(cai['strides'])} strides for shape {v.shape}")
        v.strides = tuple(int(s) // item for s in cai["strides"])
    v.ptr = int(cai["data"][0])
    v.readonly = bool(cai["data"][1])
    if v.ptr == 0 and all(s > 0 for s in v.shape):
        raise ValueError(f"{name}: null data pointer")
    _check_aligned(v, name)
    v.kind = "cupy" if type(x).__module__.startswith("cupy") else "cai"
    if v.kind == "cupy":
        import cupy

        v.device = x.device.id
        with cupy.cuda.Device(v.device):  # CuPy's current stream is per device: the array's
            v.stream = v.producer = cupy.cuda.get_current_stream().ptr
    else:
        s = cai.get("stream")
        v.stream = 0 if s in (None, 1, 2) else int(s)
        v.producer = None if s is None else v.stream
        v.device = x.device if isinstance(x, DeviceArray) else _pointer_device(v, name)
    return v


_MEMORY_UNREGISTERED, _MEMORY_DEVICE = 0, 2  # cudaMemoryType


def _pointer_device(v: _View, name):
    """The GPU a __cuda_array_interface__ pointer lives on (the interface does not say), or None for
    memory every device reaches (managed, mapped host); a pointer CUDA does not know is refused."""
    if v.extent() is None:
        return None  # nothing is read or written
    rc, memory_type, device = _cuda.pointer_device(v.ptr)
    _check_runtime(rc, name)
    if memory_type == _MEMORY_UNREGISTERED:
        raise ValueError(f"{name}: data pointer {v.ptr:#x} is not CUDA memory")
    return device if memory_type == _MEMORY_DEVICE else None


def _check_aligned(v: _View, name):
    """The kernels load whole elements: a misaligned one faults, and that error is sticky (it ends
    the process's CUDA context, torch's included)."""
    item = _DTYPE_BYTES[v.dtype]
    if v.ptr % item:
        raise ValueError(f"{name}: data pointer {v.ptr:#x} is not aligned to its {item}-byte elements")


def _elements_overlap(shape, strides) -> bool:
    """Whether two indices of a strided array can share an element. Sufficient test: ordered by
    stride, each dimension's stride is beyond the span of the dimensions inside it (true of every
    view numpy or torch makes by slicing, transposing or broadcasting away from zero strides)."""
    if 0 in shape:
        return False  # no elements
    span = 0
    for n, st in sorted(((n, abs(st)) for n, st in zip(shape, strides) if n > 1), key=lambda p: p[1]):
        if st <= span:
            return True
        span += st * (n - 1)
    return False


def _empty_like(v: _View, shape, dtype_code):
    """A new device array of the same library as v."""
    if v.kind == "torch":
        import torch

        dt = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}[dtype_code]
        return torch.empty(shape, dtype=dt, device=v.obj.device)
    if v.kind == "cupy":
        import cupy

        return cupy.empty(shape, dtype={0: cupy.float32, 1: cupy.float16}[dtype_code])
    out = DeviceArray(shape, {0: np.float32, 1: np.float16}[dtype_code])
    out.stream = v.stream  # written there: a consumer must order after it
    return out


def _uint8_like(v: _View, shape):
    if v.kind == "torch":
        import torch

        return torch.empty(shape, dtype=torch.uint8, device=v.obj.device)
    if v.kind == "cupy":
        import cupy

        return cupy.empty(shape, dtype=cupy.uint8)
    out = DeviceArray(shape, np.uint8)
    out.stream = v.stream
    return out


def _ptr(x):
    if _is_torch(x):
        return x.data_ptr()
    return int(x.__cuda_array_interface__["data"][0])


@contextlib.contextmanager
def _current_device(device):
    """Makes `device` the current GPU for the block and restores the caller's afterwards (a cache's
    kernels, copies and allocations must happen on its own GPU, whatever the caller switched to)."""
    rc, current = _cuda.get_device()
    _check(rc, "device")
    if current == device:
        yield
        return
    _check(_cuda.set_device(device), "device")
    try:
        yield
    finally:
        _cuda.set_device(current)


def _on_own_device(method):
    """Runs a PagedKVCache method with the cache's GPU current (see _current_device)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        rc, current = _cuda.get_device()
        if rc == 0 and current == self._device:  # the usual case, without a context manager's cost
            return method(self, *args, **kwargs)
        with _current_device(self._device):
            return method(self, *args, **kwargs)
    return wrapper


def _order_after(stream, view, what):
    """Orders kvarn's work on `stream` after the work the array's producer queued (CUDA Array Interface
    v3: the consumer waits for the stream the interface names; torch and CuPy arrays: their library's current
    stream). Where that is another stream than `stream` (another library's, or a plain interface naming its
    own), `stream` waits for it through an event (no host wait). Not while attend is captured into a graph
    (an event recorded outside the capture cannot be waited on inside it): order such arrays before capturing.
    A producer stream that is itself being captured is refused: waiting on it would pull `stream` into that
    capture."""
    if view.producer is None or view.producer == stream:
        return
    if _capturing(view.producer, what):
        raise RuntimeError(f"{view.name}: its stream is being captured into a CUDA graph while {what} runs "
                           "on another stream; pass it on the same stream, or outside the capture")
    rc, event = _cuda.event_create()
    _check_runtime(rc, what)
    try:
        _check_runtime(_cuda.event_record(event, view.producer), what)
        _check_runtime(_cuda.stream_wait_event(stream, event), what)
    finally:
        _cuda.event_destroy(event)  # released once the recorded work is done


def _token_slice(view, pos, m):
    """Tokens [pos, pos + m) of a [B, T, ...] view, without copying."""
    if pos == 0 and m == view.shape[1]:
        return view
    sub = _View()
    for attr in _View.__slots__:
        setattr(sub, attr, getattr(view, attr))
    sub.ptr = view.ptr + pos * view.strides[1] * _DTYPE_BYTES[view.dtype]
    sub.shape = (view.shape[0], m) + tuple(view.shape[2:])
    sub.shape0 = sub.shape
    return sub


def _check_device(view, name, device):
    """A tensor on another GPU than the kernels run on would be read through a wrong address space."""
    if view.device is not None and int(view.device) != int(device):
        raise ValueError(f"{name}: on cuda:{view.device}, but the kernels run on cuda:{device}")


def _check_no_gpu_head_dim(head_dim, name="head_dim"):
    if head_dim not in GPU_HEAD_DIMS:
        raise ValueError(
            f"{name}: unsupported head_dim {head_dim} for the CUDA kernels; they serve {list(GPU_HEAD_DIMS)} "
            "(use the CPU path for others)"
        )


def _queue_checks(checks, flag_ptr, stream, what):
    """Queues the checking kernel over each (view, NaN/Inf bit, |x| > 65504 bit) of checks (at most three: a
    step's q, k and v), in one launch; the bits land in the int32 at flag_ptr."""
    _check(_cuda.check_many(tuple(view.spec() for view, _, _ in checks), tuple((nf, r) for _, nf, r in checks),
                            flag_ptr, stream), what)


def _kv_checks(vk, vv):
    """k's and v's checks for _queue_checks, with the bits _flag_error reads."""
    return ((vk, _cuda.FLAG_K_NONFINITE, _cuda.FLAG_K_RANGE), (vv, _cuda.FLAG_V_NONFINITE, _cuda.FLAG_V_RANGE))


def _flag_error(flag):
    # In the CPU path's order: k is checked whole (NaN/Inf, then range) before v.
    for name, nonfinite, out_of_range in (("k", _cuda.FLAG_K_NONFINITE, _cuda.FLAG_K_RANGE),
                                          ("v", _cuda.FLAG_V_NONFINITE, _cuda.FLAG_V_RANGE)):
        if flag & nonfinite:
            return ValueError(f"{name}: contains NaN or Inf")
        if flag & out_of_range:
            return ValueError(f"{name}: values beyond the fp16 range (|x| > {FP16_MAX:g}) cannot be stored")
    overflow = [name for name, bit in (("k", _cuda.FLAG_K_SCALE_OVERFLOW), ("v", _cuda.FLAG_V_SCALE_OVERFLOW))
                if flag & bit]
    if overflow:
        return ValueError(
            f"{' and '.join(overflow)}: a tile has values too large for its fp16 scale vectors after rotation; "
            "keep |k|, |v| well inside the fp16 range"
        )
    if flag & _cuda.FLAG_KEY_NORM:
        return ValueError(
            "k: a tile's keys decode to norms beyond sqrt(head_dim) * 2**17, where the GPU attention could "
            "overflow without noticing (extreme values such as +-65504 spikes); the CPU KVCache takes them "
            "and raises at attend if they overflow"
        )
    return None


def _flags_pointer(flags, device):
    """The device address of append_attend's flags: a 1-element (or longer) int32 array on the cache's GPU."""
    if _is_torch(flags):
        import torch

        if not flags.is_cuda or flags.dtype != torch.int32 or flags.numel() < 1 or not flags.is_contiguous():
            raise TypeError(f"flags: expected a contiguous int32 CUDA tensor of at least one element, got "
                            f"{flags.dtype} shape {tuple(flags.shape)} on {flags.device}")
        if flags.device.index != device:
            raise ValueError(f"flags: on {flags.device}, but the kernels run on cuda:{device}")
        return flags.data_ptr()
    cai = getattr(flags, "__cuda_array_interface__", None)
    if cai is None or cai["typestr"] != "<i4" or not cai["shape"] or int(np.prod(cai["shape"])) < 1 or (
            cai.get("strides") not in (None, (4,))):
        raise TypeError("flags: expected a contiguous int32 GPU array of at least one element (torch, CuPy, "
                        "DeviceArray)")
    if cai["data"][1]:
        raise ValueError("flags: the array is read-only")
    if isinstance(flags, DeviceArray) and flags.device != device:
        raise ValueError(f"flags: on cuda:{flags.device}, but the kernels run on cuda:{device}")
    return int(cai["data"][0])


def flags_error(flags: int, *, query: str = "q"):
    """The ValueError that validate=True would have raised for the bits append_attend(..., flags=) ORed in (None
    for none). A query beyond the fp16 range (|q| > 65504) is refused outright here: validate=True would then
    measure max |q| against the float32 score bound, which needs q itself, gone by the time the bits are read."""
    flags = int(flags)
    if flags & _Q_NONFINITE:
        return ValueError(f"{query}: contains NaN or Inf")
    if flags & _Q_RANGE:
        return ValueError(f"{query}: values beyond the fp16 range (|x| > {FP16_MAX:g}), which deferred checks refuse "
                          "(validate=True measures them against the float32 score bound instead)")
    return _flag_error(flags)


class _Scratch:
    """A grow-only device buffer. keep_old: superseded buffers stay allocated (a captured CUDA graph
    may still write them)."""

    def __init__(self, keep_old=False):
        self.buf = None
        self.old = [] if keep_old else None

    def get(self, nbytes):
        if self.buf is None or self.buf.nbytes < nbytes:
            if self.old is not None and self.buf is not None:
                self.old.append(self.buf)
            self.buf = DeviceArray((max(int(nbytes), 256),), np.uint8)
        return self.buf.ptr


def _check_runtime(rc, what):
    if rc:
        raise RuntimeError(f"{what}: CUDA error: {_cuda.runtime_error(rc)}")


class _Event(_OwnsDeviceResources):
    """A CUDA event owned by kvarn (no timing), re-recorded after each call it tracks."""

    def __init__(self):
        rc, self.handle = _cuda.event_create()
        _check_runtime(rc, "event")
        self.recorded = False

    def __del__(self):
        handle = getattr(self, "handle", 0)
        if handle and _cuda is not None:
            _cuda.event_destroy(handle)  # released once its last record completes
            self.handle = 0


class _StreamState:
    """A PagedKVCache's device buffers for the calls issued on one stream - calls on two streams
    never share metadata, flags or split states - and the event recorded after the latest of them."""

    def __init__(self):
        self.flag = DeviceArray((1,), np.int32)
        self.append_meta, self.attend_meta, self.scratch = _Scratch(), _Scratch(), _Scratch()
        self.undo = _Scratch()  # append_attend's copies of the tails its step consumes
        self.done = _Event()
        self.records = 0  # how many times `done` was recorded
        self.waited = {}  # id(other state) -> its `records` when this stream last waited for it


_CAPTURE_ERRORS = range(900, 909)  # cudaErrorStreamCapture*: the query itself is refused by a capture


def _capturing(stream, what) -> bool:
    """Whether the stream is being captured into a CUDA graph. A query refused because of a capture
    counts as yes (then nothing is recorded or waited on); any other error is raised (a stale stream
    handle, a sticky error from an earlier kernel) rather than reported as a capture."""
    rc, capturing = _cuda.stream_capturing(stream)
    if rc in _CAPTURE_ERRORS:
        return True
    _check_runtime(rc, what)
    return capturing


_keepalive = []

# ---- standalone store -------------------------------------------------------------
def quantize_tiles(k, v, preset: PresetLike = DEFAULT_PRESET, *, iters: int = SINKHORN_ITERS, validate: bool = True):
    """GPU twin of ``kvarn.quantize_tile`` for many tiles: k, v [n, G, D] on the GPU
    (float32/float16/bfloat16) -> records uint8 [n, record_bytes] on the GPU, same library as k.
    validate=False skips the NaN/Inf check and the wait for its result (for timing)."""
    _require()
    p = get_preset(preset)
    vk, vv = _view(k, "k"), _view(v, "v")
    rc, device = _cuda.get_device()
    _check(rc, "quantize_tiles")
    _check_device(vk, "k", device)
    _check_device(vv, "v", device)
    if _capturing(vk.stream, "quantize_tiles"):
        raise RuntimeError("quantize_tiles: cannot be captured in a CUDA graph (it allocates and uploads its job "
                           "list); use PagedKVCache.append outside the capture")
    if len(vk.shape) != 3:
        raise ValueError(f"k: expected a 3-D array [n, G, D], got shape {vk.shape}")
    if vv.shape != vk.shape:
        raise ValueError(f"v: shape {vv.shape} does not match k's {vk.shape}")
    n, G, D = vk.shape
    if G != p.group:
        raise ValueError(f"k: a {p.name} tile holds {p.group} tokens, got {G} (shape {vk.shape})")
    _check_no_gpu_head_dim(D, "k.shape[-1]")
    if not _cuda.format_supported(p.kbits, p.vbits, p.group, D):
        raise ValueError(f"preset: {p.describe()} is not served by the CUDA kernels")
    iters = check_iters(iters)
    layout = _cuda.record_layout(p.kbits, p.vbits, p.group, D)
    records = _uint8_like(vk, (n, layout["total"]))
    if n == 0:
        return records
    stream = vk.stream
    _order_after(stream, vv, "quantize_tiles")
    flag = DeviceArray((1,), np.int32).zero_(stream)
    if validate:  # as quantize_tile on the CPU: NaN/Inf and values beyond fp16 are refused
        _queue_checks(_kv_checks(vk, vv), flag.ptr, stream, "quantize_tiles")
    # As a cache of one head: tile i -> page i; [n, G, D] seen as [B=n, T=G, Hk=1, D].
    jobs = np.zeros((n, 7), np.int32)
    jobs[:, 2] = np.arange(n)
    jobs[:, 3] = np.arange(n)
    jobs_dev = DeviceArray.from_numpy(jobs, stream)
    cache = dict(kbits=p.kbits, vbits=p.vbits, group=G, head_dim=D, num_kv_heads=1, num_layers=1, num_slots=1,
                 sink_cap=0, max_tiles=0, num_pages=n, pool=_ptr(records), sink_k=0, sink_v=0, tail_k=0, tail_v=0,
                 block_table=0)

    def as4(view):
        return (view.ptr, view.dtype, (n, G, 1, D), (view.strides[0], view.strides[1], 0, view.strides[2]))

    _check(_cuda.store(cache, as4(vk), as4(vv), jobs_dev.ptr, jobs_dev.nbytes, n, iters, False, flag.ptr, stream),
           "quantize_tiles")
    if not validate:
        _keepalive.append((jobs_dev, flag))  # freed later; cudaFree waits for the kernel
        del _keepalive[:-8]
        return records
    f = flag.to_numpy(stream)[0]  # synchronises: also keeps jobs_dev alive until the kernel ran
    err = _flag_error(int(f) & ~_cuda.FLAG_KEY_NORM)  # the norm matters to the cache's attention only
    if err is not None:
        raise err
    return records


# ---- the paged cache -------------------------------------------------------------
class AttendPlan(_OwnsDeviceResources):
    """Device-side metadata of one attend() batch, reusable while the sequences' lengths
    stay the same (e.g. inside a captured CUDA graph). Made by PagedKVCache.plan(); read-only
    (the kernels trust its batch, splits and metadata) and usable only with the cache that made it."""

    _copy_instead = "; make another with PagedKVCache.plan()"

    def __init__(self, owner, meta_dev, slots, splits, tiles_per_split, layer, lengths, tiles):
        self._owner, self._meta_dev, self._slots = owner, meta_dev, tuple(slots)
        self._splits, self._tiles_per_split, self._layer = int(splits), int(tiles_per_split), int(layer)
        self._tiles = tiles  # for attends of groups above 8 query heads, which choose their own splits
        self._slot_index = np.array(slots, np.intp)  # for the per-call check, vectorised
        self._lengths = read_only(np.array(lengths, np.int64))  # its flag cannot be set again
        self._checked_epoch = owner._epoch  # the owner's lengths epoch these lengths were last seen at
        # Split states of attends with this plan (see PagedKVCache.attend); the event and stream of the
        # last one not captured, so that an attend with this plan on another stream waits for it.
        self._scratch = _Scratch(keep_old=True)
        self._done, self._stream = None, None

    meta_dev = property(lambda self: self._meta_dev)
    batch = property(lambda self: len(self._slots))
    seq_ids = property(lambda self: self._slots)
    splits = property(lambda self: self._splits, doc="The split choice for up to 8 query heads per kv head "
                      "(attend chooses again for a larger group, which runs more programs per kv head).")
    tiles_per_split = property(lambda self: self._tiles_per_split)
    layer = property(lambda self: self._layer)
    lengths = property(lambda self: self._lengths, doc="The sequences' lengths when the plan was made.")


class StepCheckpoint(_OwnsDeviceResources):
    """Some sequences' state before a step, made by PagedKVCache.checkpoint() for its rollback(): their lengths
    in every layer, the slot versions, the pages a copy on write could replace (with their stamps) and, in a
    device buffer of its own, the fp16 tail rows that newer tokens could overwrite once a tile completes.
    Opaque, and usable only with the cache that made it."""

    _copy_instead = "; make another with PagedKVCache.checkpoint()"

    def __init__(self, owner, slots, layer, n_tokens, lengths, versions, pages, saved, buf):
        self._owner, self._slots, self._layer, self._n_tokens = owner, tuple(slots), layer, int(n_tokens)
        self._layers = list(range(owner.num_layers)) if layer is None else [layer]
        self._lengths, self._versions = lengths, versions  # [L, B] every layer's; [B]
        self._pages = pages  # per slot: (first tile, its pages from there, their stamps)
        self._saved, self._buf = saved, buf  # [(tail rows address, copy address, row bytes per head)], the copy

    seq_ids = property(lambda self: self._slots)
    layer = property(lambda self: self._layer, doc="The one layer it covers, or None: every layer.")
    n_tokens = property(lambda self: self._n_tokens, doc="The most tokens per sequence and layer it undoes.")


def _choose_splits(tiles, programs_per_seq, num_sms):
    """(splits, tiles per split) for sequences of `tiles` tiles: of the distinct splittings of the
    longest one, the fewest waves of ~1 program per SM, then the fewest splits (first minimum)."""
    nmax = int(tiles.max()) if len(tiles) else 0
    if nmax == 0:
        return 1, 1
    s = np.arange(1, min(nmax, 256) + 1, dtype=np.int64)
    tps = -(-nmax // s)
    s = s[(s == 1) | (-(-nmax // tps) >= s)]  # the others split like a smaller s
    tps = -(-nmax // s)
    programs = programs_per_seq * (-(-np.asarray(tiles, np.int64)[None, :] // tps[:, None])).sum(axis=1)
    waves = -(-programs // num_sms)
    cost = waves * (-(-tps // 8) + 1)  # 8 warps per program, ~1 tile of latency per program
    best = int(np.argmin(cost))
    return int(s[best]), int(tps[best])


class PagedKVCache(_OwnsDeviceResources):
    """KVarN KV cache for many sequences on one GPU, for ``num_layers`` layers.

    Storage, all allocated up front with cudaMalloc:
    - a pool of ``num_pages`` pages; a page holds one tile (``group`` tokens) of one
      sequence for every layer and kv head, as SPEC §6 records;
    - per sequence slot: fp16 sink (first ``sink_tokens`` tokens) and fp16 tail
      (the unfinished tile), per layer and kv head;
    - a block table [max_seqs, max_tiles] mapping a sequence's tile i to its page.
    Pages are taken from a free list as tiles complete and returned by free() (or truncate()); fork()
    shares a sequence's pages with a new one, and a shared page returns when no sequence holds it.
    checkpoint() and rollback() undo appends exactly (a step refused part-way through the layers).
    """

    _copy_instead = ("; fork() copies a sequence within the cache; to move one elsewhere, go through the CPU: to_cpu() "
                     "gives a kvarn.KVCache (which copies and pickles), load_cpu() loads one")

    # Read-only: the device buffers were sized by them, and the kernels trust them.
    num_kv_heads = property(lambda self: self._num_kv_heads)
    head_dim = property(lambda self: self._head_dim)
    preset = property(lambda self: self._preset)
    num_layers = property(lambda self: self._num_layers)
    max_seqs = property(lambda self: self._max_seqs)
    max_seq_len = property(lambda self: self._max_seq_len)
    sink_tokens = property(lambda self: self._sink_tokens)
    iters = property(lambda self: self._iters)
    max_tiles = property(lambda self: self._max_tiles)
    num_pages = property(lambda self: self._num_pages)
    num_sms = property(lambda self: self._num_sms)
    record_bytes = property(lambda self: self._record_bytes)
    device = property(lambda self: self._device)

    def __init__(self, num_kv_heads: int, head_dim: int, preset: PresetLike = DEFAULT_PRESET, *, num_layers: int = 1,
                 max_seqs: int = 16, max_seq_len: int = 32768, num_pages: int | None = None,
                 sink_tokens: int | None = None, iters: int = SINKHORN_ITERS, device: int | None = None):
        if _cuda is None:
            _require()
        rc, count = _cuda.device_count()
        if rc != _cuda.OK or count == 0:
            _require()  # no GPU or no driver: the RuntimeError every entry point gives
        if device is not None:
            device = check_positive_int(device, "device", 0)
            if device >= count:
                raise ValueError(f"device: cuda:{device} is not visible here ({count} device(s))")
        _require(device)  # the cache's GPU, not the current one: on a mixed machine they may differ
        self._num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self._head_dim = check_positive_int(head_dim, "head_dim")
        _check_no_gpu_head_dim(self.head_dim)
        self._preset = get_preset(preset)
        if not _cuda.format_supported(self.preset.kbits, self.preset.vbits, self.preset.group, self.head_dim):
            raise ValueError(f"preset: {self.preset.describe()} is not served by the CUDA kernels")
        self._num_layers = check_positive_int(num_layers, "num_layers")
        self._max_seqs = check_positive_int(max_seqs, "max_seqs")
        self._max_seq_len = check_positive_int(max_seq_len, "max_seq_len")
        G = self.preset.group
        self._sink_tokens = G if sink_tokens is None else check_positive_int(sink_tokens, "sink_tokens", 0)
        self._iters = check_iters(iters)
        self._max_tiles = max(1, -(-max(self.max_seq_len - self.sink_tokens, 0) // G))
        self._num_pages = (self.max_seqs * self.max_tiles if num_pages is None
                           else check_positive_int(num_pages, "num_pages"))
        if self.num_pages > 2**31 - 1:  # page numbers are int32 on the device
            raise ValueError(f"num_pages: max_seqs x tiles per sequence = {self.num_pages} pages is more than the "
                             f"kernels address (2**31 - 1); lower max_seqs or max_seq_len, or pass num_pages")
        rc, previous = _cuda.get_device()
        _check(rc, "device")
        self._device = previous if device is None else device
        # Allocate on the cache's GPU, then leave the caller's current device as it was; every later
        # call switches to the cache's GPU for its duration (_on_own_device).
        with _current_device(self._device):
            self._allocate()

    def _allocate(self):
        G = self.preset.group
        rc, props = _cuda.device_props(self.device)
        _check(rc, "device")
        self._num_sms = int(props["multiprocessors"])
        self._record_bytes = int(_cuda.record_layout(self.preset.kbits, self.preset.vbits, G, self.head_dim)["total"])
        # the kernels' swapped-operand tiles (attend_d128.cu): k4v2_g128 at head_dim 128, programs of <= 4 query rows
        p = self.preset
        self._swapped_tiles = (p.kbits, p.vbits, G, self.head_dim) == (4, 2, 128, 128)
        L, S, H, D = self.num_layers, self.max_seqs, self.num_kv_heads, self.head_dim
        # A sequence never holds more than max_seq_len tokens, so neither does its sink: a larger
        # sink_tokens (no token is ever quantised) needs no rows beyond that.
        sink_cap = min(self.sink_tokens, self.max_seq_len)
        # zeroed: a deferred step whose checks flag its keys skips its tile's store, and its attend then reads the
        # page unwritten (the flags refuse the step's output); a defined read for a page never stored into
        self._pool = DeviceArray((L, self.num_pages, H, self.record_bytes), np.uint8).zero_(0)
        self._sink_k = DeviceArray((L, S, H, max(sink_cap, 1), D), np.float16)
        self._sink_v = DeviceArray((L, S, H, max(sink_cap, 1), D), np.float16)
        self._tail_k = DeviceArray((L, S, H, G, D), np.float16)
        self._tail_v = DeviceArray((L, S, H, G, D), np.float16)
        # zeroed: an entry read before any store wrote it points into the pool (page 0), never outside
        self._block_table = DeviceArray((S, self.max_tiles), np.int32).zero_(0)
        self._streams = collections.OrderedDict()  # stream handle -> _StreamState, least recent first
        # A flag no kernel sets: write_tokens reads it when validate=False, so that a tile the store
        # kernel flags (keys beyond the norm bound, fp16 scale overflow) cannot stop the batch's tokens
        # from landing while the lengths advance.
        self._never_set = DeviceArray((1,), np.int32).zero_(0)
        _check(_cuda.stream_sync(0), "PagedKVCache")
        self._split_choices = {}  # (tiles bytes, programs per sequence) -> (splits, tiles per split)
        self._lengths = np.zeros((L, S), np.int64)
        self._epoch = 0  # bumped whenever a length changes: a plan checked at this epoch is still valid
        self._pages = [[] for _ in range(S)]  # pages of each slot, tile order (shared by layers)
        self._free_pages = list(range(self.num_pages - 1, -1, -1))
        self._page_refs = np.zeros(self.num_pages, np.int32)  # the sequences holding each page (fork shares them)
        # For rollback(): a stamp per page from one counter, renewed when the page is taken from the pool or stored
        # into in place (a checkpoint that gave a page up takes it back only if its stamp is the one it saw), the
        # stamp it was taken with (to give pages back in the order they were taken), and a version per slot, bumped
        # by what checkpoints cannot undo (add_sequence, free, truncate, load_cpu, a rollback that moves it).
        self._page_gen = np.zeros(self.num_pages, np.int64)
        self._page_taken = np.zeros(self.num_pages, np.int64)
        self._gen = 0
        self._versions = np.zeros(S, np.int64)
        self._free_slots = list(range(S - 1, -1, -1))
        self._live = set()
        self._desc = dict(kbits=self.preset.kbits, vbits=self.preset.vbits, group=G, head_dim=D, num_kv_heads=H,
                          num_layers=L, num_slots=S, sink_cap=sink_cap, max_tiles=self.max_tiles,
                          num_pages=self.num_pages, pool=self._pool.ptr, sink_k=self._sink_k.ptr,
                          sink_v=self._sink_v.ptr, tail_k=self._tail_k.ptr, tail_v=self._tail_v.ptr,
                          block_table=self._block_table.ptr)

    # ---- streams -----------------------------------------------------------------
    # kvarn orders its own work on the cache across the caller's streams; the caller orders the
    # data it depends on (an attend after the appends it reads, as for any tensor written on
    # another stream). Each stream gets its own metadata, flag and split-state buffers, so calls
    # on two streams may run at once (attends with one plan share its buffer: the later waits).
    # An append waits (on the GPU, no host sync) for kvarn's earlier calls on every other stream:
    # it may write pages, sink or tail rows that a freed or truncated sequence's attend, still
    # queued there, reads. Host reads and writes (records, to_cpu, load_cpu) wait for all of them.
    # Work captured into a CUDA graph is not tracked: order a graph's replays as its stream requires.
    _MAX_STREAMS = 32  # torch's pool cycles through 32 streams per priority

    def _stream_state(self, stream) -> _StreamState:
        st = self._streams.get(stream)
        if st is not None:
            self._streams.move_to_end(stream)
            return st
        if len(self._streams) < self._MAX_STREAMS:
            st = _StreamState()
        else:  # the least recently used stream's buffers move here, once its work is done (a host sync)
            _, st = self._streams.popitem(last=False)
            if st.done.recorded:
                _check_runtime(_cuda.event_sync(st.done.handle), "stream")
            st.done.recorded = False
            st.waited = {}  # the new stream has waited for nothing yet
        self._streams[stream] = st
        return st

    def _wait_for_other_streams(self, stream, mine, what):
        # Only for work recorded since this stream last waited: what it waited for before is ordered.
        for other, st in self._streams.items():
            if other != stream and st.done.recorded and mine.waited.get(id(st)) != st.records:
                _check_runtime(_cuda.stream_wait_event(stream, st.done.handle), what)
                mine.waited[id(st)] = st.records

    def _done(self, st, stream, what):
        _check_runtime(_cuda.event_record(st.done.handle, stream), what)
        st.done.recorded = True
        st.records += 1

    def _sync_streams(self, what):
        """Waits for every call kvarn issued on the cache, whatever its stream."""
        for st in self._streams.values():
            if st.done.recorded:
                _check_runtime(_cuda.event_sync(st.done.handle), what)

    # ---- sequences -------------------------------------------------------------
    def add_sequence(self) -> int:
        """Returns the id of a new, empty sequence."""
        if not self._free_slots:
            raise RuntimeError(f"PagedKVCache: all {self.max_seqs} sequence slots are in use; free() one first")
        slot = self._free_slots.pop()
        self._live.add(slot)
        self._lengths[:, slot] = 0
        self._epoch += 1
        self._versions[slot] += 1
        return slot

    def free(self, seq_id) -> None:
        """Releases a sequence and its pages."""
        slot = self._slot(seq_id, "seq_id")
        self._release_pages(self._pages[slot])
        self._pages[slot] = []
        self._lengths[:, slot] = 0
        self._epoch += 1
        self._versions[slot] += 1
        self._live.discard(slot)
        self._free_slots.append(slot)

    def truncation_point(self, seq_id, length: int, *, layer: int = 0) -> int:
        """Where to ``truncate`` so that appending tokens ``[point, length)`` again gives exactly
        the sequence that only ever held the first ``length`` tokens: ``length``, or the start of
        the quantised tile it would cut (as kvarn.KVCache.truncation_point)."""
        layer, slot = self._layer(layer), self._slot(seq_id, "seq_id")
        return self._cut(slot, layer, length)[0]

    def _cut(self, slot, layer, length):
        n = int(self._lengths[layer, slot])
        length = check_positive_int(length, "length", 0)
        if length > n:
            raise ValueError(f"length: {length} is more than the {n} tokens of sequence {slot} in layer {layer}")
        sink_len = min(n, self.sink_tokens)
        return tile_cut_point(length, sink_len, self.preset.group, int(self._tile_counts(n))), n

    def truncate(self, seq_id, length: int, *, layer: int | None = None) -> None:
        """Keeps a sequence's first ``length`` tokens in every layer (or one ``layer``): drops any
        number of fp16 tail and sink tokens and whole quantised tiles, and returns pages no layer
        uses any more. A cut inside a quantised tile raises ValueError and changes nothing; cut at
        ``truncation_point`` and append the kept tokens again instead. Plans made before no longer
        apply to this sequence."""
        slot = self._slot(seq_id, "seq_id")
        layers = range(self.num_layers) if layer is None else [self._layer(layer)]
        for lay in layers:  # check every layer before changing any
            point, _ = self._cut(slot, lay, length)
            if point != length:
                raise ValueError(
                    f"length: {length} cuts the quantised tile of tokens {point}..{point + self.preset.group - 1} "
                    f"(layer {lay}), whose tokens are stored only as codes; truncate to {point} and append the "
                    "kept tokens again")
        for lay in layers:
            self._lengths[lay, slot] = length
        self._epoch += 1
        self._versions[slot] += 1
        needed = int(self._tile_counts(self._lengths[:, slot]).max())
        self._release_pages(self._pages[slot][needed:])
        del self._pages[slot][needed:]

    @_on_own_device
    def fork(self, seq_id) -> int:
        """A new sequence holding exactly what ``seq_id`` holds, in every layer (parallel sampling from one
        prompt, beam search): returns its id. The completed tiles' pages are shared, not copied: a page goes
        back to the pool when no sequence holds it, and is copied first (every layer's records of the tile) if
        a sequence stores into a tile another one shares, which only a truncation followed by new tokens does.
        The fp16 sink and tail rows are copied (each sequence appends into its own). Either sequence may then
        append, truncate or be freed without changing the other. Waits for kvarn's queued work (as to_cpu)."""
        slot = self._slot(seq_id, "seq_id")
        if not self._free_slots:
            raise RuntimeError(f"PagedKVCache: all {self.max_seqs} sequence slots are in use; free() one first")
        new = self._free_slots[-1]  # taken below, once its rows are copied
        self._sync_streams("fork")  # queued appends may still write the rows copied here
        lens = self._lengths[:, slot]
        sink_len = np.minimum(lens, self.sink_tokens)
        tail_len = lens - sink_len - self._tile_counts(lens) * self.preset.group
        H, D = self.num_kv_heads, self.head_dim
        for buf, rows in ((self._sink_k, sink_len), (self._sink_v, sink_len), (self._tail_k, tail_len),
                          (self._tail_v, tail_len)):
            per_head = buf.shape[3] * D * 2
            for layer in np.flatnonzero(rows).tolist():  # the rows in use only (the rest was never written):
                src = buf.ptr + (layer * self.max_seqs + slot) * H * per_head  # each head's first rows[layer]
                dst = buf.ptr + (layer * self.max_seqs + new) * H * per_head
                _check(_cuda.memcpy_2d_dtod(dst, per_head, src, per_head, int(rows[layer]) * D * 2, H, 0), "fork")
        pages = self._pages[slot]
        if pages:  # the attend kernels read the new sequence's tiles through its block-table row
            row = np.asarray(pages[: self.max_tiles], np.int32)
            _check(_cuda.memcpy_htod(self._block_table.ptr + new * self.max_tiles * 4, row.view(np.uint8), 0), "fork")
        _check(_cuda.stream_sync(0), "fork")
        self._free_slots.pop()
        self._live.add(new)
        self._pages[new] = list(pages)
        self._page_refs[pages] += 1
        self._lengths[:, new] = lens
        self._epoch += 1
        return new

    # ---- checkpoints ---------------------------------------------------------------
    @_on_own_device
    def checkpoint(self, seq_ids, n_tokens: int, *, layer: int | None = None) -> StepCheckpoint:
        """What rollback() needs to put these sequences back exactly as they are now, in every layer (or one
        ``layer``), after appends (append, append_attend) of at most ``n_tokens`` tokens each per layer: an engine
        running a step layer by layer undoes the layers done when a later one refuses the step, which truncate()
        cannot do once the step completed a tile (its tokens are then stored only as codes).

        Copies the fp16 tail rows in use that those tokens could overwrite (the tokens after a completed tile
        reuse its rows) into the checkpoint's own device buffer, on the default stream after kvarn's queued work
        (no host wait); for n_tokens=1 (a decode step) there are none: no device work at all."""
        slots = self._slots(seq_ids)
        n = check_positive_int(n_tokens, "n_tokens", 0)
        layer = None if layer is None else self._layer(layer)
        lens = self._lengths[:, slots]  # a copy (fancy indexing)
        sub = lens if layer is None else lens[layer : layer + 1]
        pages = []
        # tiles below every layer's count are never stored into by these appends: only later pages can change
        # (the count at the shortest layer's length: counts grow with the length)
        for slot, shortest in zip(slots, sub.min(axis=0).tolist()):
            t0 = self._tile_count(shortest)
            held = self._pages[slot][t0:]
            pages.append((t0, held, self._page_gen[held].tolist() if held else []))
        saved, buf = [], None
        if n > 1:
            tail = sub - np.minimum(sub, self.sink_tokens) - self._tile_counts(sub) * self.preset.group
            # rows in use that the tokens after the first completed tile (if any, within n) would write
            rows = np.minimum(tail, n - 1 - self._tokens_before_a_tile(sub))
            picks = np.argwhere(rows > 0).tolist()
            if picks:
                H, D, pitch = self.num_kv_heads, self.head_dim, self.preset.group * self.head_dim * 2
                buf = DeviceArray((2 * H * D * 2 * int(rows[rows > 0].sum()),), np.uint8)
                st = self._stream_state(0)
                self._wait_for_other_streams(0, st, "checkpoint")
                dst = buf.ptr
                for tail_buf in (self._tail_k, self._tail_v):
                    for i, b in picks:
                        width = int(rows[i, b]) * D * 2  # each head's first rows, packed in the copy
                        src = tail_buf.ptr + self._slot_rows_offset(i if layer is None else layer, slots[b], 0)
                        _check(_cuda.memcpy_2d_dtod(dst, width, src, pitch, width, H, 0), "checkpoint")
                        saved.append((src, dst, width))
                        dst += width * H
                self._done(st, 0, "checkpoint")
        return StepCheckpoint(self, slots, layer, n, lens, self._versions[slots], pages, saved, buf)

    @_on_own_device
    def rollback(self, checkpoint: StepCheckpoint) -> None:
        """Puts the checkpoint's sequences back exactly as they were at checkpoint() in its layers: lengths,
        pages (a page a copy on write replaced is taken back, the pages taken since go back to the pool unless a
        fork made since holds them), page counts, block-table entries and tail rows; attend then gives what it
        gave then, bit for bit. The same checkpoint may be rolled back to again. Plans made before no longer
        apply. Waits for kvarn's queued work (as fork).

        Valid while, since the checkpoint, those sequences only received appends in its layers, at most
        n_tokens each per layer (refused ones count for nothing), and none in other layers. Anything else
        (truncate, free, load_cpu, more tokens, a rollback that moved them to another state, which invalidates
        every other checkpoint of theirs) raises ValueError and changes nothing; so does a page a copy on
        write replaced that went back to the pool and was taken again (or stored into in place) meanwhile."""
        point = checkpoint
        if not isinstance(point, StepCheckpoint):
            raise TypeError(f"checkpoint: expected a StepCheckpoint from PagedKVCache.checkpoint(), got "
                            f"{type(point).__name__}")
        if point._owner is not self:
            raise ValueError("checkpoint: made by another PagedKVCache; roll back with the cache that made it")
        slots, layers = list(point._slots), point._layers
        for slot, version in zip(slots, point._versions.tolist()):
            if slot not in self._live or self._versions[slot] != version:
                raise ValueError(f"checkpoint: sequence {slot} was freed, truncated, loaded or rolled back to "
                                 "another state since the checkpoint; it can no longer be rolled back to")
        now = self._lengths[:, slots]
        grown = now - point._lengths
        inside = np.zeros(self.num_layers, bool)
        inside[layers] = True
        bad = np.argwhere(np.where(inside[:, None], (grown < 0) | (grown > point.n_tokens), grown != 0))
        if len(bad):
            lay, b = bad[0].tolist()
            was, got = int(point._lengths[lay, b]), int(now[lay, b])
            what = (f"changed length ({was} -> {got}) outside the checkpoint's layer" if not inside[lay] else
                    f"holds {got} tokens, fewer than its {was} at the checkpoint" if got < was else
                    f"received {got - was} tokens since the checkpoint, more than its n_tokens={point.n_tokens}")
            raise ValueError(f"checkpoint: sequence {slots[b]} {what} in layer {lay}")
        for slot, (t0, held, gens) in zip(slots, point._pages):
            for ti, page, gen in zip(range(t0, t0 + len(held)), held, gens):
                if self._pages[slot][ti] != page and self._page_gen[page] != gen:
                    raise ValueError(f"checkpoint: page {page} (sequence {slot}, tile {ti}), which a copy on write "
                                     "replaced since, was reused or stored into meanwhile; it cannot be taken back")
        self._sync_streams("rollback")  # queued work may still use the rows and entries put back here
        # Host bookkeeping first: a failing copy must not leave it saying the appends happened.
        gone, table = [], []
        for slot, (t0, held, _) in zip(slots, point._pages):
            pages = self._pages[slot]
            for ti, page in zip(range(t0, t0 + len(held)), held):
                if pages[ti] != page:  # replaced by a copy on write: take the page back
                    gone.append(pages[ti])
                    if self._page_refs[page] == 0:  # in the pool still, unchanged (same stamp)
                        self._free_pages.remove(page)
                    self._page_refs[page] += 1
                    pages[ti] = page
                    table.append((slot, ti, page))
            gone += pages[t0 + len(held):]  # no layer holds these tiles any more
            del pages[t0 + len(held):]
        # latest taken back to the pool first, so that it hands them out again in the order it did
        self._release_pages(sorted(gone, key=self._page_taken.__getitem__))
        moved = (grown[layers] != 0).any(axis=0)
        self._lengths[np.ix_(layers, slots)] = point._lengths[layers]
        self._versions[np.asarray(slots)[moved]] += 1  # checkpoints taken after this one no longer apply
        point._versions = self._versions[slots]
        self._epoch += 1
        pitch = self.preset.group * self.head_dim * 2
        for tail, copy, width in point._saved:
            _check(_cuda.memcpy_2d_dtod(tail, pitch, copy, width, width, self.num_kv_heads, 0), "rollback")
        for slot, ti, page in table:
            self._set_block_table(slot, ti, page, 0, "rollback")
        _check(_cuda.stream_sync(0), "rollback")

    def length(self, seq_id, layer: int = 0) -> int:
        return int(self._lengths[self._layer(layer), self._slot(seq_id, "seq_id")])

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def nbytes(self) -> int:
        """Device bytes held by the cache's buffers."""
        return sum(b.nbytes for b in (self._pool, self._sink_k, self._sink_v, self._tail_k, self._tail_v,
                                      self._block_table))

    def _slot(self, seq_id, name):
        if isinstance(seq_id, (bool, np.bool_)) or not isinstance(seq_id, (int, np.integer)):
            raise TypeError(f"{name}: expected an int sequence id, got {type(seq_id).__name__}")
        if int(seq_id) not in self._live:
            raise KeyError(f"{name}: no live sequence with id {seq_id}")
        return int(seq_id)

    def _slots(self, seq_ids):
        if isinstance(seq_ids, (int, np.integer)):
            seq_ids = [seq_ids]
        if isinstance(seq_ids, (str, bytes)) or not hasattr(seq_ids, "__iter__"):
            raise TypeError(f"seq_ids: expected a list of int sequence ids, got {type(seq_ids).__name__}")
        seq_ids = list(seq_ids)
        # Fast path (every decode step, every layer): plain live ints; the loop names a bad one.
        if all(type(s) is int for s in seq_ids) and self._live.issuperset(seq_ids):
            slots = seq_ids
        else:
            slots = [self._slot(s, f"seq_ids[{i}]") for i, s in enumerate(seq_ids)]
        if not slots:
            raise ValueError("seq_ids: expected at least one sequence")
        if len(set(slots)) != len(slots):
            raise ValueError("seq_ids: a sequence appears twice")
        return slots

    def _layer(self, layer):
        if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)):
            raise TypeError(f"layer: expected an int, got {type(layer).__name__}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer: {layer} is outside [0, {self.num_layers})")
        return int(layer)

    def _tile_counts(self, lengths):
        return np.maximum(lengths - self.sink_tokens, 0) // self.preset.group

    def _tile_count(self, length: int) -> int:
        """_tile_counts of one Python int (a few rows' worth of numpy calls cost more than the loop)."""
        return max(length - self.sink_tokens, 0) // self.preset.group

    # ---- append ----------------------------------------------------------------
    @_on_own_device
    def append(self, seq_ids, k, v, *, layer: int = 0, validate: bool = True) -> None:
        """Appends T tokens to each listed sequence: k, v [B, T, Hk, D] (or [B, Hk, D] for T = 1),
        bfloat16/float16/float32 on the GPU. Completed tiles are quantised on the GPU.

        validate=True (default) checks for NaN/Inf and the fp16 range on the GPU and waits
        for the result (one stream synchronisation), so a rejected append raises and leaves
        the cache unchanged. validate=False skips the checks and the wait."""
        layer = self._layer(layer)
        slots = self._slots(seq_ids)
        vk, vv = self._token_views(k, v, len(slots), one_token_form=True)
        T = vk.shape[1]
        if T == 0:
            return
        stream = vk.stream
        if _capturing(stream, "append"):
            raise RuntimeError("append: cannot be captured in a CUDA graph (it uploads host metadata and takes "
                               "pages); capture attend(q, plan=...) only")
        _order_after(stream, vv, "append")
        self._check_room(layer, slots, T, "k")
        self._append_tokens(layer, slots, vk, vv, stream, check_input=validate, check_store=validate)

    def _token_views(self, k, v, n_seqs, one_token_form):
        """Views of k, v [B, T, Hk, D] (one_token_form: or [B, Hk, D], as T = 1) for n_seqs sequences."""
        vk, vv = _view(k, "k"), _view(v, "v")
        H, D = self.num_kv_heads, self.head_dim
        for name, view in (("k", vk), ("v", vv)):
            _check_device(view, name, self.device)
            if one_token_form and len(view.shape) == 3:  # [B, Hk, D]: one token each
                view.shape = (view.shape[0], 1) + view.shape[1:]
                view.strides = (view.strides[0], 0) + view.strides[1:]
            if len(view.shape) != 4 or view.shape[2] != H or view.shape[3] != D:
                also = f" (or [B, {H}, {D}])" if one_token_form else ""
                raise ValueError(f"{name}: expected shape [B, T, {H}, {D}]{also}, got {view.shape0}")
            if view.shape[0] != n_seqs:
                raise ValueError(f"{name}: batch of {view.shape[0]} for {n_seqs} sequences")
        if vv.shape != vk.shape:
            raise ValueError(f"v: shape {vv.shape} does not match k's {vk.shape}")
        B, T = vk.shape[0], vk.shape[1]
        if B * T * H > 2**31 - 1:  # write_tokens launches a block per token and head (a grid dimension)
            raise ValueError(f"k: {B} x {T} tokens x {H} kv heads is more than one append launches (2**31 - 1 "
                             "token rows); append in parts")
        return vk, vv

    def _check_room(self, layer, slots, n_tokens, name):
        lens1 = self._lengths[layer, slots] + n_tokens
        over = np.nonzero(lens1 > self.max_seq_len)[0]
        if over.size:
            i = int(over[0])
            raise ValueError(f"{name}: sequence {slots[i]} would hold {int(lens1[i])} tokens; "
                             f"this cache was made for max_seq_len={self.max_seq_len}")

    def _append_tokens(self, layer, slots, vk, vv, stream, *, check_input, check_store, cow=None, store_flag=None,
                       attend_meta=None, counts=None):
        """append() of checked views k, v [B, T, Hk, D] on `stream`, room checked. check_input: the
        NaN/Inf and fp16-range checks on the GPU; check_store: wait for the store kernel's flags (key
        norm, scale overflow) where tiles complete. Either raises with this call's pages returned and
        the tails and lengths unchanged (write_tokens skips a flagged batch). cow: a list that collects the
        shared pages this call copied (_own_page), for a caller that may undo the call later (_undo_copies).
        store_flag: where the store kernel ORs its flags instead (append_attend's flags=; nothing waits for it).
        attend_meta: an attend launch's metadata (int32 [rows][4]) to upload in the same copy (a host-to-device
        copy of a few bytes costs the host several microseconds): returns its device address and the bytes
        from there; the caller then records the stream's event (append_attend, after its attend launch).
        counts: (the slots' lengths, their tile counts before and after) where the caller has them."""
        B, T, G = vk.shape[0], vk.shape[1], self.preset.group
        if counts is None:
            lens0 = self._lengths[layer, slots]
            counts = lens0, self._tile_counts(lens0), self._tile_counts(lens0 + T)
        lens0, tiles0, tiles1 = counts
        lens1 = lens0 + T

        # Host bookkeeping first (pages), undone if the GPU rejects the input.
        new_pages = []
        cow = [] if cow is None else cow
        cow0 = len(cow)
        jobs = []
        try:
            for b in np.flatnonzero(tiles1 > tiles0).tolist():  # the sequences that complete tiles
                slot = slots[b]
                for ti in range(int(tiles0[b]), int(tiles1[b])):
                    if ti == len(self._pages[slot]):  # no layer has this tile yet
                        page = self._take_page()
                        self._pages[slot].append(page)
                        new_pages.append((slot, page))
                    else:  # another layer stored it: a page a fork shares is copied before this layer writes
                        self._own_page(slot, ti, cow)
                    start = self.sink_tokens + ti * G
                    n_old = int(min(max(lens0[b] - start, 0), G))
                    t0 = int(start + n_old - lens0[b])
                    jobs.append((slot, layer, self._pages[slot][ti], b, n_old, t0, ti))
        except Exception:
            self._undo_pages(new_pages)
            self._undo_copies(cow, cow0, stream)
            raise
        # One host buffer: meta int32 [B][3] (slot, length before, first tail position), then the jobs [n][7],
        # then attend_meta.
        n_jobs = 3 * B + 7 * len(jobs)
        host = np.empty(n_jobs + (0 if attend_meta is None else attend_meta.size), np.int32)
        meta = host[: 3 * B].reshape(B, 3)
        meta[:, 0], meta[:, 1], meta[:, 2] = slots, lens0, self.sink_tokens + tiles1 * G
        if jobs:
            host[3 * B : n_jobs] = np.asarray(jobs, np.int32).reshape(-1)
        if attend_meta is not None:
            host[n_jobs:] = attend_meta.reshape(-1)
        checked = check_input or (check_store and bool(jobs))
        try:
            st = self._stream_state(stream)
            base = st.append_meta.get(host.nbytes)
            meta_bytes = st.append_meta.buf.nbytes
            flag = st.flag
            self._wait_for_other_streams(stream, st, "append")
            self._copy_pages(cow[cow0:], stream)
            _check(_cuda.memcpy_htod(base, host.view(np.uint8), stream), "append")
            if checked or (jobs and store_flag is None):  # the stream's flag is read (store skips a flagged batch)
                _check(_cuda.memset(flag.ptr, 0, 4, stream), "append")
            if check_input:
                _queue_checks(_kv_checks(vk, vv), flag.ptr, stream, "append")
            # Store first: completed tiles read their older rows from the tail, which write_tokens
            # then reuses for the newest tokens (and skips if validation flagged anything).
            if jobs:
                _check(_cuda.store(self._desc, vk.spec(), vv.spec(), base + meta.nbytes, meta_bytes - meta.nbytes,
                                   len(jobs), self.iters, True, flag.ptr if store_flag is None else store_flag,
                                   stream), "append")
            _check(_cuda.write_tokens(self._desc, layer, vk.spec(), vv.spec(), base, meta_bytes, B,
                                      flag.ptr if checked else self._never_set.ptr, stream), "append")
            if checked:
                err = _flag_error(int(flag.to_numpy(stream)[0]))
                if err is not None:
                    raise err
        except Exception:
            self._undo_pages(new_pages)
            self._undo_copies(cow, cow0, stream)
            raise
        self._lengths[layer, slots] = lens1
        self._epoch += 1
        if attend_meta is not None:
            return base + 4 * n_jobs, meta_bytes - 4 * n_jobs
        # After the commit: the kernels are queued, so the host state must say so whatever this raises.
        self._done(st, stream, "append")
        return None

    def _out_of_pages(self):
        return RuntimeError(f"PagedKVCache: out of pages ({self.num_pages} in the pool); free() sequences or make "
                            "the cache with more num_pages")

    def _undo_pages(self, new_pages):
        for slot, page in reversed(new_pages):
            self._pages[slot].remove(page)
            self._release_pages([page])

    def _take_page(self):
        if not self._free_pages:
            raise self._out_of_pages()
        page = self._free_pages.pop()
        self._page_refs[page] = 1
        self._page_taken[page] = self._stamp(page)
        return page

    def _stamp(self, page):
        self._gen += 1
        self._page_gen[page] = self._gen
        return self._gen

    def _release_pages(self, pages):
        """Drops a sequence's hold on pages (in tile order); a page no sequence holds goes back to the pool."""
        for page in reversed(pages):
            self._page_refs[page] -= 1
            if self._page_refs[page] == 0:
                self._free_pages.append(page)

    def _pages_needed(self, slots, tiles0, tiles1):
        """Pages that storing tiles tiles0..tiles1 - 1 of each slot takes: the tiles no layer has yet, and the
        shared ones that must be copied first (_own_page; of n sequences sharing a page that all store into it,
        n - 1 copy it, and the last one finds it its own)."""
        need, copied = 0, collections.Counter()
        for slot, t0, t1 in zip(slots, tiles0.tolist(), tiles1.tolist()):
            pages = self._pages[slot]
            need += max(0, t1 - len(pages))
            for page in pages[t0:t1]:
                if self._page_refs[page] - copied[page] > 1:
                    copied[page] += 1
                    need += 1
        return need

    def _own_page(self, slot, ti, cow):
        """Makes tile ti's page the slot's own where a fork shares it (copy on write): a new page takes its
        place, and (slot, ti, shared page, new page) goes to cow; _copy_pages then queues the records' copy."""
        page = self._pages[slot][ti]
        if self._page_refs[page] > 1:
            new = self._take_page()
            self._page_refs[page] -= 1
            self._pages[slot][ti] = new
            cow.append((slot, ti, page, new))
        else:  # stored into in place: a checkpoint that gave this page up (a copy on write) cannot take it back
            self._stamp(page)

    def _copy_pages(self, cow, stream, what="append"):
        """Queues the copies of cow's shared pages (the records of every layer that holds the tile; the others
        were never written) and points the block table at them."""
        page_bytes = self.num_kv_heads * self.record_bytes
        for slot, ti, page, new in cow:
            for layer in np.flatnonzero(self._tile_counts(self._lengths[:, slot]) > ti).tolist():
                base = self._pool.ptr + layer * self.num_pages * page_bytes
                _check(_cuda.memcpy_dtod(base + new * page_bytes, base + page * page_bytes, page_bytes, stream), what)
            self._set_block_table(slot, ti, new, stream, what)

    def _set_block_table(self, slot, ti, page, stream, what):
        _check(_cuda.memcpy_htod(self._block_table.ptr + (slot * self.max_tiles + ti) * 4,
                                 np.array([page], np.int32).view(np.uint8), stream), what)

    def _undo_copies(self, cow, start, stream, what="append"):
        """Gives the slots back the shared pages of cow[start:], returning the copies to the pool (the host's
        bookkeeping first), and points the block table at the shared pages again."""
        undone = cow[start:]
        del cow[start:]
        for slot, ti, page, new in reversed(undone):
            self._pages[slot][ti] = page
            self._page_refs[page] += 1
            self._release_pages([new])
        for slot, ti, page, _ in undone:
            self._set_block_table(slot, ti, page, stream, what)

    # ---- attention ----------------------------------------------------------------
    def _choose_splits(self, tiles, programs_per_seq):
        """Splits of each sequence's tiles over programs: fewest waves of ~1 program per SM,
        then the fewest splits (each costs merge work). Remembered for the last few batches: every
        layer of a decode step asks with the same lengths."""
        key = (tiles.tobytes(), int(programs_per_seq))
        choice = self._split_choices.get(key)
        if choice is None:
            choice = _choose_splits(tiles, programs_per_seq, self.num_sms)
            if len(self._split_choices) >= 64:
                self._split_choices.pop(next(iter(self._split_choices)))
            self._split_choices[key] = choice
        return choice

    def _programs_per_seq(self, num_q_heads, q_rows=8):
        """Attend programs per sequence and split: one per kv head and q_rows of its query heads (a group of 9-16
        runs two of 8 rows). The split choice counts 8-row programs (4-row ones, _choose_q_rows, only where one
        wave holds them anyway); counting one per kv head whatever the group gave a group of 16 at 32K x 1 two
        waves: 1.3-1.7x slower (s94, an H100)."""
        return self.num_kv_heads * -(-(num_q_heads // self.num_kv_heads) // q_rows)

    def _choose_q_rows(self, num_q_heads, batch, splits, tiles_per_split):
        """The most query rows an attend program takes (the kernels: 4 or 8). 4 for a k4v2_g128 head_dim-128 group
        of more than 4 query heads where its programs are short (<= 8 tiles) and, split in programs of 4 rows, still
        one wave: there the swapped-operand tiles (and warp pairs, where they fit) serve them, which the row-split
        tiles that take 8 rows do not (s93c, an H100, Hk 8: 4K x 1 at 5-16 heads per kv head 1.5-2.0x faster);
        elsewhere 8 (longer programs: 4-row programs read each record twice as often, 0.71-0.96x)."""
        group = num_q_heads // self.num_kv_heads
        if group <= 4 or tiles_per_split > 8 or not self._swapped_tiles:
            return 8
        per_seq = self._programs_per_seq(num_q_heads, 4)
        return 4 if splits * per_seq * batch <= self.num_sms and per_seq <= MAX_GRID_YZ else 8

    def _plan_host(self, seq_ids, layer, num_q_heads):
        layer = self._layer(layer)
        slots = self._slots(seq_ids)
        if len(slots) > MAX_ATTEND_BATCH:
            raise ValueError(f"seq_ids: {len(slots)} sequences in one attend; the CUDA launch takes at most "
                             f"{MAX_ATTEND_BATCH} (a grid dimension), split the batch")
        lens = self._lengths[layer, slots]
        empty = np.nonzero(lens == 0)[0]
        if empty.size:
            raise ValueError(f"seq_ids: sequence {slots[int(empty[0])]} is empty; append tokens before attending")
        meta, tiles = self._meta_rows(slots, lens)
        splits, tps = self._choose_splits(tiles, self._programs_per_seq(num_q_heads))
        return layer, meta, splits, tps, lens.copy(), tiles

    def _meta_rows(self, slots, lens, tiles=None):
        """The attend kernels' metadata int32 [n][4] (slot, tiles, sink_len, tail_len) of slots attending
        their first lens tokens (holding `tiles` tiles, where the caller has them), and the tile counts."""
        tiles = self._tile_counts(lens) if tiles is None else tiles
        sink_len = np.minimum(lens, self.sink_tokens)
        meta = np.empty((len(lens), 4), np.int32)
        meta[:, 0], meta[:, 1], meta[:, 2], meta[:, 3] = slots, tiles, sink_len, lens - sink_len - tiles * self.preset.group
        return meta, tiles

    @_on_own_device
    def plan(self, seq_ids, *, layer: int = 0, stream=0) -> AttendPlan:
        """Uploads the metadata of an attend() batch into its own device buffer (on ``stream``, a
        cudaStream_t handle, and waits for it: the plan is ready for any stream on return). Valid
        while those sequences keep their lengths; attend(q, plan=...) then copies nothing from the
        host and can be captured in a CUDA graph: run it once outside the capture first (the plan
        allocates its split-state buffer then), and keep the plan alive as long as the graph."""
        stream = _check_stream(stream)
        if _capturing(stream, "plan"):
            raise RuntimeError("plan: cannot be captured in a CUDA graph (it allocates and uploads); make the "
                               "plan before capturing")
        layer, meta, splits, tps, lens, tiles = self._plan_host(seq_ids, layer, self.num_kv_heads)
        meta_dev = DeviceArray.from_numpy(meta, stream)
        _check(_cuda.stream_sync(stream), "plan")
        return AttendPlan(self, meta_dev, meta[:, 0].tolist(), splits, tps, layer, lens, tiles)

    def _check_plan(self, plan):
        if not isinstance(plan, AttendPlan):
            raise TypeError(f"plan: expected an AttendPlan from PagedKVCache.plan(), got {type(plan).__name__}")
        if plan._owner is not self:
            raise ValueError("plan: made by another PagedKVCache; make one with this cache's plan()")
        # Per call (the fast path): nothing changed since the plan was last checked -> valid. Else one
        # vectorised comparison; the loop only names the culprit. free() zeroes a slot's lengths and a
        # plan never covers an empty sequence, so a freed slot always shows up as a length change.
        if plan._checked_epoch == self._epoch:
            return
        if np.array_equal(self._lengths[plan.layer, plan._slot_index], plan.lengths):
            plan._checked_epoch = self._epoch
            return
        for slot, n in zip(plan.seq_ids, plan.lengths):
            if slot not in self._live:
                raise ValueError(f"plan: sequence {slot} was freed since the plan was made; make a new plan")
            now = int(self._lengths[plan.layer, slot])
            if now != n:
                raise ValueError(f"plan: sequence {slot} holds {now} tokens in layer {plan.layer}, {int(n)} when the "
                                 "plan was made; make a new plan")

    @_on_own_device
    def attend(self, q, seq_ids=None, *, layer: int | None = None, scale=None, out=None,
               plan: AttendPlan | None = None, validate: bool = True):
        """Decode attention of q [B, Hq, D] (one query token per sequence) over every cached
        token of each sequence; Hq a multiple of num_kv_heads (GQA). Returns [B, Hq, D] in q's
        dtype and library (or writes into out). scale defaults to 1/sqrt(D); layer to 0, or to the
        plan's layer (a different one is refused).

        validate=True checks q for NaN/Inf on the GPU (one synchronisation). With a plan
        (see plan()) nothing is copied from the host, so the call can be captured in a CUDA graph."""
        vq = _view(q, "q")
        D = self.head_dim
        if len(vq.shape) != 3:
            raise ValueError(f"q: expected a 3-D array [B, Hq, D], got shape {vq.shape}")
        B, Hq, _ = vq.shape
        self._check_query_heads(vq)
        scale = check_scale(scale, D)
        stream = vq.stream
        capturing = _capturing(stream, "attend")
        if capturing and (plan is None or validate):
            raise RuntimeError("attend: only attend(q, plan=..., validate=False) can be captured in a CUDA graph "
                               "(seq_ids upload host metadata; validate waits for the GPU)")
        st = None if capturing else self._stream_state(stream)
        if plan is None:
            if seq_ids is None:
                raise ValueError("seq_ids: required unless a plan is given")
            layer, meta, splits, tps, _, _ = self._plan_host(seq_ids, 0 if layer is None else layer, Hq)
            n_seqs = len(meta)
            meta_ptr = st.attend_meta.get(meta.nbytes)
            meta_bytes = st.attend_meta.buf.nbytes
        else:
            meta = None
            if seq_ids is not None:
                raise ValueError("plan: pass either seq_ids or a plan, not both")
            self._check_plan(plan)
            if layer is not None and self._layer(layer) != plan.layer:
                raise ValueError(f"layer: {layer}, but the plan was made for layer {plan.layer}; make a plan per layer")
            layer, splits, tps, meta_ptr = plan.layer, plan.splits, plan.tiles_per_split, plan.meta_dev.ptr
            if Hq > 8 * self.num_kv_heads:
                splits, tps = self._choose_splits(plan._tiles, self._programs_per_seq(Hq))
            meta_bytes = plan.meta_dev.nbytes
            n_seqs = plan.batch
        if B != n_seqs:
            raise ValueError(f"q: batch of {B} queries for {n_seqs} sequences")
        if out is None:
            if capturing and vq.kind != "torch":  # torch's allocator takes part in captures; cudaMalloc does not
                raise RuntimeError("attend: pass out= when capturing with a non-torch q (a new output array "
                                   "would be allocated inside the capture)")
            out = _empty_like(vq, (B, Hq, D), vq.dtype)
        vo = self._out_view(out, vq)
        if not capturing:
            _order_after(stream, vo, "attend")
        if validate:
            _check(_cuda.memset(st.flag.ptr, 0, 4, stream), "attend")
            _queue_checks(((vq, _Q_NONFINITE, _Q_RANGE),), st.flag.ptr, stream, "attend")
            self._refuse_queries(vq, int(st.flag.to_numpy(stream)[0]), scale, stream)
        if meta is not None:  # uploaded once every check passed: a refused call leaves nothing queued
            _check(_cuda.memcpy_htod(meta_ptr, meta.reshape(-1).view(np.uint8), stream), "attend")
        # Split states: the plan's own buffer (a captured graph keeps writing it, so it must not be
        # shared with, or freed by, other calls), else the stream's.
        scratch_bytes = _cuda.attend_scratch_bytes(B, Hq, D, splits)
        holder = st.scratch if plan is None else plan._scratch
        if capturing and (holder.buf is None or holder.buf.nbytes < scratch_bytes):
            raise RuntimeError("attend: this plan has not run with this many query heads outside the capture; "
                               "run attend(q, plan=...) once before capturing it (it allocates the plan's buffer)")
        scratch = holder.get(scratch_bytes)
        if plan is not None and not capturing and plan._stream not in (None, stream):
            _check_runtime(_cuda.stream_wait_event(stream, plan._done.handle), "attend")  # shared split states
        _check(_cuda.attend(self._desc, layer, meta_ptr, meta_bytes, B, vq.spec(), Hq, scale, vo.spec(), scratch,
                            holder.buf.nbytes, splits, tps, self._choose_q_rows(Hq, B, splits, tps), stream), "attend")
        if st is not None:
            self._done(st, stream, "attend")
            if plan is not None:
                if plan._done is None:
                    plan._done = _Event()
                _check_runtime(_cuda.event_record(plan._done.handle, stream), "attend")
                plan._stream = stream
        if isinstance(out, DeviceArray):
            out.stream = stream
        return out

    @_on_own_device
    def append_attend(self, q, seq_ids, k, v, *, layer: int = 0, scale=None, out=None, validate: bool = True,
                      flags=None):
        """A multi-token step (a draft to verify in speculative decoding, a chunk of prompt): appends n
        tokens to each listed sequence, k, v [B, n, Hk, D], and attends their queries q [B, n, Hq, D]
        causally, query token i over every cached token up to and including new token i. Returns
        [B, n, Hq, D] in q's dtype and library (or writes into out).

        Token i reads what attend() reads after appending the tokens one at a time: the step runs in
        chunks that complete no tile (a token completing one on its own, after its tile is quantised),
        each one append and one attend launch whose rows are the chunk's (sequence, token) pairs. The
        outputs equal one-at-a-time attends bit for bit where the launch splits the tiles alike (the
        split is chosen for the whole launch, as attend() chooses it for its batch).

        validate=True checks q, k and v on the GPU first (one synchronisation) and waits for the store
        kernel where a tile completes; a refused step raises and leaves the cache as it was (lengths,
        pages, and the tails the step's completed tiles consumed, restored from a copy; an `out` given may hold
        the outputs of the chunks before the refusal). validate=False checks nothing on the GPU and never waits.

        flags (with validate=False): a 1-element int32 device array (torch or __cuda_array_interface__) into which
        the same checks OR their bits on the GPU (the store kernel's too), without waiting and without refusing:
        the step lands whatever they find. Read it when the GPU has run (once for a whole forward, say) and give
        it to ``flags_error``; to undo a step it flags, take a ``checkpoint`` before it and ``rollback``. The
        caller zeroes it."""
        layer = self._layer(layer)
        slots = self._slots(seq_ids)
        vq = _view(q, "q")
        if len(vq.shape) != 4:
            raise ValueError(f"q: expected a 4-D array [B, n, Hq, D], got shape {vq.shape0}")
        B, n, Hq, D = vq.shape
        if B != len(slots):
            raise ValueError(f"q: batch of {B} queries for {len(slots)} sequences")
        self._check_query_heads(vq)
        vk, vv = self._token_views(k, v, len(slots), one_token_form=False)
        if vk.shape[1] != n:
            raise ValueError(f"k: {vk.shape[1]} tokens per sequence for q's {n}")
        if B * n > MAX_ATTEND_BATCH:
            raise ValueError(f"q: {B} sequences x {n} tokens are more rows than one attend launches "
                             f"({MAX_ATTEND_BATCH}, a grid dimension); split the step")
        scale = check_scale(scale, D)
        stream = vq.stream
        flags_ptr = None
        if flags is not None:
            if validate:
                raise ValueError("flags: the checks that write them do not wait or refuse; pass validate=False")
            flags_ptr = _flags_pointer(flags, self.device)
        if _capturing(stream, "append_attend"):
            raise RuntimeError("append_attend: cannot be captured in a CUDA graph (it appends: host metadata, "
                               "pages)")
        decode = self._decode_rows(layer, slots) if n == 1 and B <= _DECODE_ROWS else None
        if decode is None:
            lens0 = self._lengths[layer, slots]  # a copy (fancy indexing)
            if int(lens0.max()) + n > self.max_seq_len:
                self._check_room(layer, slots, n, "k")
            tiles0 = self._tile_counts(lens0)
            before_a_tile = self._tokens_before_a_tile(lens0, tiles0)
            # the pages the step's tiles take, counted before anything changes (as append finds out on the host)
            if int(before_a_tile.min()) < n and self._pages_needed(slots, tiles0, self._tile_counts(lens0 + n)) > len(
                    self._free_pages):
                raise self._out_of_pages()
        if out is None:
            out = _empty_like(vq, vq.shape, vq.dtype)
            vo = _view(out, "out")  # a new array: nothing to check
        else:
            vo = self._out_view(out, vq, vk, vv)
        if n == 0:
            return out
        for view in (vk, vv, vo):
            _order_after(stream, view, "append_attend")
        st = self._stream_state(stream)
        step_checks = ((vq, _Q_NONFINITE, _Q_RANGE),) + _kv_checks(vk, vv)  # q, k and v whole
        if flags_ptr is not None:
            _queue_checks(step_checks, flags_ptr, stream, "append_attend")
        if validate:  # before anything changes
            _check(_cuda.memset(st.flag.ptr, 0, 4, stream), "append_attend")
            _queue_checks(step_checks, st.flag.ptr, stream, "append_attend")
            flag = int(st.flag.to_numpy(stream)[0])
            self._refuse_queries(vq, flag, scale, stream)
            err = _flag_error(flag)
            if err is not None:
                raise err
        if decode is not None:
            self._decode_step(layer, slots, decode, vk, vv, vq, vo, scale, st, stream)
            if isinstance(out, DeviceArray):
                out.stream = stream
            return out
        pages0 = [len(self._pages[slot]) for slot in slots]
        cow = []  # shared pages the step's chunks copied
        saved = self._save_tails(layer, slots, lens0, n, st, stream) if validate else []
        pos, lens, tiles = 0, lens0, tiles0
        try:
            while pos < n:
                if pos:
                    lens = self._lengths[layer, slots]
                    tiles = self._tile_counts(lens)
                    before_a_tile = self._tokens_before_a_tile(lens, tiles)
                # as many tokens as complete no tile; 0 free: the next token completes one, alone
                m = max(1, min(n - pos, int(before_a_tile.min())))
                # a chunk of more than one token completes no tile; one token may complete some
                tiles_after = tiles if m > 1 or int(before_a_tile.min()) > 0 else self._tile_counts(lens + 1)
                # row b * m + i: token pos + i of sequence b, attending its first lens + i + 1 tokens
                if m == 1:
                    meta, seen_tiles = self._meta_rows(slots, lens + 1, tiles_after)
                else:
                    meta, seen_tiles = self._meta_rows(np.repeat(slots, m),
                                                       (lens[:, None] + np.arange(1, m + 1)).reshape(-1))
                splits, tps = self._choose_splits(seen_tiles, self._programs_per_seq(Hq))
                meta_ptr, meta_bytes = self._append_tokens(
                    layer, slots, _token_slice(vk, pos, m), _token_slice(vv, pos, m), stream, check_input=False,
                    check_store=validate, cow=cow, store_flag=flags_ptr, attend_meta=meta,
                    counts=(lens, tiles, tiles_after))
                self._launch_attend(stream, layer, meta_ptr, meta_bytes, _token_slice(vq, pos, m),
                                    _token_slice(vo, pos, m), scale, splits, tps, st)
                pos += m
        except BaseException:
            self._undo_step(layer, slots, lens0, pages0, cow, saved, st, stream)
            raise
        self._done(st, stream, "append_attend")
        if isinstance(out, DeviceArray):
            out.stream = stream
        return out

    def _decode_rows(self, layer, slots):
        """A one-token step's metadata worked out in Python ints (on a few rows cheaper than numpy's per-call cost,
        ~1-4 us an operation, which _append_tokens and _meta_rows pay on every layer of every decode step): the
        upload, int32 [B][3] write_tokens rows (slot, length before, first tail row) then [B][4] attend rows (slot,
        tiles, sink_len, tail_len), the tile counts and the lengths before. None where a row's token completes a
        tile or would pass max_seq_len: the general path takes those steps (pages, store jobs, the refusal)."""
        sink, G = self.sink_tokens, self.preset.group
        row = self._lengths[layer]
        write, attend, tiles, lengths = [], [], [], []
        for slot in slots:
            length = row.item(slot)
            if length >= self.max_seq_len:
                return None
            t = self._tile_count(length)
            seen = length + 1
            sink_len = min(seen, sink)
            tail_len = seen - sink_len - t * G
            if tail_len == G:  # the token completes tile t
                return None
            write += (slot, length, sink + t * G)
            attend += (slot, t, sink_len, tail_len)
            tiles.append(t)
            lengths.append(length)
        return np.array(write + attend, np.int32), np.array(tiles, np.int64), lengths

    def _decode_step(self, layer, slots, decode, vk, vv, vq, vo, scale, st, stream):
        """append_attend's one-token step that completes no tile (_decode_rows' metadata): the upload, the token
        write and the attend, what the general path's one chunk queues for it, without its bookkeeping (no pages,
        no store jobs, no tails to save)."""
        host, tiles, lengths = decode
        B = len(slots)
        splits, tps = self._choose_splits(tiles, self._programs_per_seq(vq.shape[2]))
        try:
            base = st.append_meta.get(host.nbytes)
            meta_bytes = st.append_meta.buf.nbytes
            self._wait_for_other_streams(stream, st, "append")
            _check(_cuda.memcpy_htod(base, host.view(np.uint8), stream), "append")
            _check(_cuda.write_tokens(self._desc, layer, vk.spec(), vv.spec(), base, meta_bytes, B,
                                      self._never_set.ptr, stream), "append")
            self._launch_attend(stream, layer, base + 12 * B, meta_bytes - 12 * B, vq, vo, scale, splits, tps, st)
            row = self._lengths[layer]
            for slot, length in zip(slots, lengths):
                row[slot] = length + 1
        finally:  # queued work (or none) on the stream either way, and the lengths say what was queued
            self._epoch += 1
            self._done(st, stream, "append_attend")

    def _save_tails(self, layer, slots, lens0, n, st, stream):
        """Device copies of the layer's tails that a later refusal in the step would need back, for
        _undo_step: [(tail address, copy, bytes)]. A completed tile's rows leave the tail and newer tokens
        reuse it; a store that flags its tile skips that reuse, so only the sequences completing a tile
        before the step's last completing token are copied (none, where the step completes tiles at one
        token only)."""
        G = self.preset.group
        first = self._tokens_before_a_tile(lens0)  # the step token that completes a tile
        completes = first < n
        if not completes.any():
            return []
        last = int((first + (n - 1 - first) // G * G)[completes].max())  # the step's last completing token
        done = np.flatnonzero(completes & (first < last)).tolist()
        tail_rows = self._meta_rows(slots, lens0)[0][:, 3]
        H, D = self.num_kv_heads, self.head_dim
        # the rows in use, head by head (rows past them were never written: initcheck reads those copies as
        # uninitialised, and nothing needs them back)
        copies = [(self._slot_rows_offset(layer, slots[b], h), int(tail_rows[b]) * D * 2) for b in done for h in range(H)]
        copies = [(offset, nbytes) for offset, nbytes in copies if nbytes]
        if not copies:
            return []
        base = st.undo.get(2 * sum(nbytes for _, nbytes in copies))
        saved = []
        for tail in (self._tail_k, self._tail_v):
            for offset, nbytes in copies:
                _check(_cuda.memcpy_dtod(base, tail.ptr + offset, nbytes, stream), "append_attend")
                saved.append((tail.ptr + offset, base, nbytes))
                base += nbytes
        return saved

    def _tokens_before_a_tile(self, lens, tiles=None):
        """How many tokens sequences of these lengths (holding these tile counts) take before the next one
        completes a tile."""
        tiles = self._tile_counts(lens) if tiles is None else tiles
        return self.sink_tokens + (tiles + 1) * self.preset.group - lens - 1

    def _slot_rows_offset(self, layer, slot, head):
        """Byte offset of (layer, slot, head)'s first tail row in the tail buffers ([L, S, Hk, G, D] fp16)."""
        return (((layer * self.max_seqs + slot) * self.num_kv_heads + head) * self.preset.group) * self.head_dim * 2

    def _undo_step(self, layer, slots, lens0, pages0, cow, saved, st, stream):
        """Puts a refused append_attend's layer back as it was before the step: lengths, pages (shared ones
        too), tails (the host's bookkeeping first: a failing copy, a CUDA error, must not leave it saying the
        step happened)."""
        self._lengths[layer, slots] = lens0
        self._undo_pages([(slot, page) for slot, p0 in zip(slots, pages0) for page in self._pages[slot][p0:]])
        self._epoch += 1
        self._undo_copies(cow, 0, stream)
        for tail, copy, nbytes in saved:
            _check(_cuda.memcpy_dtod(tail, copy, nbytes, stream), "append_attend")
        self._done(st, stream, "append_attend")

    def _launch_attend(self, stream, layer, meta_ptr, meta_bytes, vq, vo, scale, splits, tps, st):
        """One attend launch of checked views q, out [S, T, Hq, D] over the S x T rows of metadata uploaded at
        meta_ptr (meta_bytes from there), with the stream's split states."""
        rows, Hq, D = vq.shape[0] * vq.shape[1], vq.shape[-2], vq.shape[-1]
        scratch = st.scratch.get(_cuda.attend_scratch_bytes(rows, Hq, D, splits))
        _check(_cuda.attend(self._desc, layer, meta_ptr, meta_bytes, rows, vq.spec(), Hq, scale,
                            vo.spec(), scratch, st.scratch.buf.nbytes, splits, tps,
                            self._choose_q_rows(Hq, rows, splits, tps), stream), "append_attend")

    def _check_query_heads(self, vq):
        """q's last two dimensions [Hq, D]: Hq a multiple of the kv heads within the launch's limit."""
        H, D = self.num_kv_heads, self.head_dim
        Hq, Dq = vq.shape[-2:]
        if Dq != D:
            raise ValueError(f"q: last dimension {Dq} does not match the cache's head_dim {D}")
        if Hq == 0 or Hq % H:
            raise ValueError(f"q: {Hq} query heads is not a positive multiple of the cache's {H} kv heads")
        programs = H * -(-(Hq // H) // 8)  # per split: <= 8 query heads each; a grid dimension
        if programs > MAX_GRID_YZ:
            raise ValueError(f"q: {Hq} query heads over {H} kv heads need {programs} programs per split; the CUDA "
                             f"launch takes at most {MAX_GRID_YZ}")
        _check_device(vq, "q", self.device)

    def _out_view(self, out, vq, *inputs):
        """The view of an output array of q's shape that the kernels may write while reading q (and inputs)."""
        vo = _view(out, "out")
        if vo.shape != vq.shape:
            raise ValueError(f"out: expected shape {vq.shape}, got {vo.shape}")
        _check_device(vo, "out", self.device)
        if vo.readonly:
            raise ValueError("out: the array is read-only")
        orng = vo.byte_range()
        for vi in (vq,) + inputs:
            r = vi.byte_range()
            if orng is not None and r is not None and orng[0] < r[1] and r[0] < orng[1]:
                raise ValueError(f"out: overlaps {vi.name} (the kernels read {vi.name} while they write out); "
                                 "pass another array")
        if _elements_overlap(vo.shape, vo.strides):
            raise ValueError(f"out: its elements may overlap (shape {vo.shape}, strides {vo.strides}; the check accepts "
                             "layouts it can prove disjoint, as any slicing or transposition of a dense array): the "
                             "kernels would write several results to one place")
        return vo

    def _refuse_queries(self, vq, flag, scale, stream):
        """Raises for what the checking kernel found in q (flag: its _Q_NONFINITE / _Q_RANGE bits)."""
        if flag & _Q_NONFINITE:
            raise ValueError("q: contains NaN or Inf")
        # As check_queries on the CPU: q * scale must not overflow the float32 scores, which the
        # kernels hold in the log2 domain (x log2(e)): the limit is the CPU's / log2(e).
        D = self.head_dim
        limit = FLOAT32_MAX / (D * 2.0**17 * math.log2(math.e))
        if (flag & _Q_RANGE) or FP16_MAX * abs(scale) > limit:
            q_max = vq.max_abs(stream)
            if q_max * abs(scale) > limit:
                raise ValueError(
                    f"q: max |q| x |scale| = {q_max * abs(scale):.3g} could overflow the float32 attention "
                    f"scores (limit {limit:.3g} at head_dim {D}); scale the queries down")

    # ---- CPU interop -------------------------------------------------------------
    @_on_own_device
    def records(self, seq_id, layer: int = 0) -> np.ndarray:
        """Host copy of a sequence's records, uint8 [num_tiles, Hk, record_bytes]."""
        layer, slot = self._layer(layer), self._slot(seq_id, "seq_id")
        n = int(self._tile_counts(self._lengths[layer, slot]))
        H, R = self.num_kv_heads, self.record_bytes
        out = np.empty((n, H, R), np.uint8)
        page_bytes = H * R
        self._sync_streams("records")
        for i in range(n):
            src = self._pool.ptr + (layer * self.num_pages + self._pages[slot][i]) * page_bytes
            _check(_cuda.memcpy_dtoh(out[i].reshape(-1), src, 0), "records")
        return out

    def _dense_host(self, buf, layer, slot, rows):
        H, D = self.num_kv_heads, self.head_dim
        per_head = buf.shape[3] * D
        out = np.empty((H, rows, D), np.float16)
        base = buf.ptr + ((layer * self.max_seqs + slot) * H) * per_head * 2
        # Only the rows in use, head by head: the rest of the slot was never written (compute-sanitizer's
        # initcheck flagged the whole-slot copy, s89), and need not cross the bus.
        for h in range(H if rows else 0):
            _check(_cuda.memcpy_dtoh(out[h].reshape(-1).view(np.uint8), base + h * per_head * 2, 0), "to_cpu")
        return out

    @_on_own_device
    def to_cpu(self, seq_id, layer: int = 0):
        """A kvarn.KVCache (CPU) holding exactly this sequence's sink, records and tail."""
        from .cache import KVCache

        layer, slot = self._layer(layer), self._slot(seq_id, "seq_id")
        n = int(self._lengths[layer, slot])
        tiles = int(self._tile_counts(n))
        sink_len = min(n, self.sink_tokens)
        tail_len = n - sink_len - tiles * self.preset.group
        self._sync_streams("to_cpu")
        return KVCache.from_parts(
            self._dense_host(self._sink_k, layer, slot, sink_len), self._dense_host(self._sink_v, layer, slot, sink_len),
            self.records(slot, layer),
            self._dense_host(self._tail_k, layer, slot, tail_len), self._dense_host(self._tail_v, layer, slot, tail_len),
            preset=self.preset, sink_tokens=self.sink_tokens, iters=self.iters)  # a custom Preset has no name to look up

    @_on_own_device
    def load_cpu(self, seq_id, cpu_cache, layer: int = 0) -> None:
        """Replaces an empty sequence's content (one layer) with a kvarn.KVCache's: its
        CPU-written records are used as they are."""
        from .cache import KVCache, check_key_norms

        layer, slot = self._layer(layer), self._slot(seq_id, "seq_id")
        if self._lengths[layer, slot]:
            raise ValueError(f"seq_id: sequence {seq_id} is not empty in layer {layer}")
        if not isinstance(cpu_cache, KVCache):
            raise TypeError(f"cpu_cache: expected a kvarn.KVCache, got {type(cpu_cache).__name__}")
        c = cpu_cache
        fmt = lambda p: (p.kbits, p.vbits, p.group)  # noqa: E731  (names may differ; the format may not)
        if (c.num_kv_heads, c.head_dim, fmt(c.preset), c.sink_tokens) != (
                self.num_kv_heads, self.head_dim, fmt(self.preset), self.sink_tokens):
            raise ValueError("cpu_cache: kv heads, head_dim, preset format (bits, group) or sink_tokens differ from "
                             "this cache's")
        parts = c.to_parts()  # one snapshot of the CPU cache
        recs = parts["records"]
        # A KVCache(quantize_on="next") keeps a full tile in its tail until the next token; this cache quantises
        # a tile as it fills, so that tile becomes a record here: the one the CPU cache writes at its next append.
        try:
            tile = c._stage_full_tail(parts["tail_k"], parts["tail_v"], parts["tail_k"].shape[1], len(recs), None)
        except ValueError as e:
            raise ValueError(f"cpu_cache: {e}") from None
        if tile is not None:
            recs = np.concatenate([recs, tile[None]])
            for name in ("tail_k", "tail_v"):
                parts[name] = parts[name][:, :0]
        if len(recs):  # attend's q check assumes these norms, and the kernels cannot report an overflow
            check_key_norms(recs.reshape(-1, recs.shape[-1]), self.preset, self.head_dim, self.num_kv_heads,
                            "cpu_cache")
        n = parts["sink_k"].shape[1] + len(recs) * self.preset.group + parts["tail_k"].shape[1]
        if n > self.max_seq_len:
            raise ValueError(f"cpu_cache: {n} tokens exceed max_seq_len={self.max_seq_len}")
        # the tiles no layer has yet, and the shared ones (fork) other layers hold, which are copied first
        need = self._pages_needed([slot], np.zeros(1, np.int64), np.array([len(recs)]))
        if need > len(self._free_pages):  # before taking any: a rejected load changes nothing
            raise RuntimeError(f"PagedKVCache: out of pages ({need} needed, {len(self._free_pages)} free); free() "
                               "sequences or make the cache with more num_pages")
        new_pages, cow = [], []
        for i in range(len(recs)):
            if i == len(self._pages[slot]):
                page = self._take_page()
                self._pages[slot].append(page)
                new_pages.append((slot, page))
            else:
                self._own_page(slot, i, cow)
        try:
            self._sync_streams("load_cpu")  # queued work may still read the pages and rows written here
            self._copy_pages(cow, 0, "load_cpu")
            self._load_parts(layer, slot, parts, recs)
        except Exception:
            self._undo_pages(new_pages)
            self._undo_copies(cow, 0, 0, "load_cpu")
            raise
        self._lengths[layer, slot] = n
        self._epoch += 1
        self._versions[slot] += 1

    def _load_parts(self, layer, slot, parts, recs):
        H, D = self.num_kv_heads, self.head_dim
        for i in range(len(recs)):
            dst = self._pool.ptr + (layer * self.num_pages + self._pages[slot][i]) * H * self.record_bytes
            _check(_cuda.memcpy_htod(dst, np.ascontiguousarray(recs[i]).reshape(-1), 0), "load_cpu")
        bt = np.asarray(self._pages[slot][: self.max_tiles], np.int32)
        if len(bt):
            _check(_cuda.memcpy_htod(self._block_table.ptr + slot * self.max_tiles * 4, bt.view(np.uint8), 0),
                   "load_cpu")

        def put(buf, rows, data):
            if rows == 0:
                return
            per_head = buf.shape[3] * D
            for h in range(H):
                dst = buf.ptr + (((layer * self.max_seqs + slot) * H) + h) * per_head * 2
                _check(_cuda.memcpy_htod(dst, np.ascontiguousarray(data[h, :rows], np.float16).reshape(-1).view(
                    np.uint8), 0), "load_cpu")

        for buf, name in ((self._sink_k, "sink_k"), (self._sink_v, "sink_v"), (self._tail_k, "tail_k"),
                          (self._tail_v, "tail_v")):
            put(buf, parts[name].shape[1], parts[name])
        _check(_cuda.stream_sync(0), "load_cpu")

    def __repr__(self):
        return (f"PagedKVCache(kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, preset={self.preset.label()}, "
                f"layers={self.num_layers}, seqs={len(self._live)}/{self.max_seqs}, "
                f"pages free {len(self._free_pages)}/{self.num_pages}, device={self.device})")
