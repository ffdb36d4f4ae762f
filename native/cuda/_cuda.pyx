# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over the kvarn CUDA C ABI (native/cuda/kvarn_cuda.h).

Device buffers are plain integers (addresses), tensors are tuples
(ptr, dtype, shape, strides-in-elements), the cache is a dict of ints. All
checks, allocation policy and friendly errors live in kvarn/cuda.py; every
function here returns the native status code (0 = ok)."""
from libc.stdint cimport int32_t, int64_t, uintptr_t

cdef extern from "kvarn_cuda.h" nogil:
    enum:
        KVARN_CUDA_OK
        KVARN_CUDA_ERR_ARGUMENT
        KVARN_CUDA_ERR_CUDA
        KVARN_F32
        KVARN_F16
        KVARN_BF16
        KVARN_FLAG_K_NONFINITE
        KVARN_FLAG_V_NONFINITE
        KVARN_FLAG_K_RANGE
        KVARN_FLAG_V_RANGE
        KVARN_FLAG_K_SCALE_OVERFLOW
        KVARN_FLAG_V_SCALE_OVERFLOW
        KVARN_FLAG_KEY_NORM

    ctypedef struct kvarn_cuda_tensor:
        uintptr_t ptr
        int32_t dtype
        int32_t ndim
        int64_t shape[4]
        int64_t stride[4]

    ctypedef struct kvarn_cuda_cache:
        int32_t kbits, vbits, group, head_dim, num_kv_heads
        int32_t num_layers, num_slots, sink_cap, max_tiles, num_pages
        uintptr_t pool, sink_k, sink_v, tail_k, tail_v, block_table

    const char* kvarn_cuda_last_error()
    int kvarn_cuda_device_count(int32_t* count)
    int kvarn_cuda_device_props(int32_t device, int64_t* props)
    int kvarn_cuda_set_device(int32_t device)
    int kvarn_cuda_get_device(int32_t* device)
    int kvarn_cuda_malloc(uintptr_t* ptr, size_t nbytes)
    int kvarn_cuda_free(uintptr_t ptr)
    int kvarn_cuda_memset(uintptr_t ptr, int value, size_t nbytes, uintptr_t stream)
    int kvarn_cuda_memcpy_htod(uintptr_t dst, const void* src, size_t nbytes, uintptr_t stream)
    int kvarn_cuda_memcpy_dtoh(void* dst, uintptr_t src, size_t nbytes, uintptr_t stream)
    int kvarn_cuda_memcpy_dtod(uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t stream)
    int kvarn_cuda_memcpy_2d_dtod(uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch, size_t width,
                                  size_t height, uintptr_t stream)
    int kvarn_cuda_stream_sync(uintptr_t stream)
    int kvarn_cuda_layout(int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim, int64_t* out)
    int kvarn_cuda_format_supported(int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim)
    enum: KVARN_CUDA_MAX_CHECKS
    int kvarn_cuda_check_many(const kvarn_cuda_tensor* xs, const int32_t* bits, int32_t count, uintptr_t flag,
                              uintptr_t stream)
    int kvarn_cuda_write_tokens(const kvarn_cuda_cache* c, int32_t layer, const kvarn_cuda_tensor* k,
                                const kvarn_cuda_tensor* v, uintptr_t meta, int32_t batch, uintptr_t flag,
                                uintptr_t stream)
    int kvarn_cuda_store(const kvarn_cuda_cache* c, const kvarn_cuda_tensor* k, const kvarn_cuda_tensor* v,
                         uintptr_t jobs, int32_t n_jobs, int32_t iters, int32_t round_f16, uintptr_t flag,
                         uintptr_t stream)
    size_t kvarn_cuda_attend_scratch(int32_t batch, int32_t num_q_heads, int32_t head_dim, int32_t splits)
    int kvarn_cuda_attend(const kvarn_cuda_cache* c, int32_t layer, uintptr_t meta, int32_t batch,
                          const kvarn_cuda_tensor* q, int32_t num_q_heads, float scale,
                          const kvarn_cuda_tensor* out, uintptr_t scratch, int32_t splits,
                          int32_t tiles_per_split, int32_t q_rows, uintptr_t stream)

# Streams and events straight from the runtime: kvarn orders its own calls across the caller's
# streams with them (kvarn/cuda.py), so they need nothing from the kernels' library.
cdef extern from "cuda_runtime_api.h" nogil:
    ctypedef void* cudaStream_t
    ctypedef void* cudaEvent_t
    ctypedef enum cudaError_t:
        cudaSuccess
    ctypedef enum cudaStreamCaptureStatus:
        cudaStreamCaptureStatusNone
    cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags)
    cudaError_t cudaEventDestroy(cudaEvent_t event)
    cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
    cudaError_t cudaEventSynchronize(cudaEvent_t event)
    cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
    cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status)
    ctypedef enum cudaMemoryType:
        cudaMemoryTypeUnregistered
    ctypedef struct cudaPointerAttributes:
        cudaMemoryType type
        int device
    cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr)
    cudaError_t cudaGetLastError()
    const char* cudaGetErrorName(cudaError_t error)
    const char* cudaGetErrorString(cudaError_t error)

OK = KVARN_CUDA_OK
ERR_ARGUMENT = KVARN_CUDA_ERR_ARGUMENT
ERR_CUDA = KVARN_CUDA_ERR_CUDA
F32 = KVARN_F32
F16 = KVARN_F16
BF16 = KVARN_BF16
FLAG_K_NONFINITE = KVARN_FLAG_K_NONFINITE
FLAG_V_NONFINITE = KVARN_FLAG_V_NONFINITE
FLAG_K_RANGE = KVARN_FLAG_K_RANGE
FLAG_V_RANGE = KVARN_FLAG_V_RANGE
FLAG_K_SCALE_OVERFLOW = KVARN_FLAG_K_SCALE_OVERFLOW
FLAG_V_SCALE_OVERFLOW = KVARN_FLAG_V_SCALE_OVERFLOW
FLAG_KEY_NORM = KVARN_FLAG_KEY_NORM


cdef int fill_tensor(kvarn_cuda_tensor* t, tuple spec) except -1:
    """spec: (ptr, dtype, shape, strides) with 1 <= len(shape) <= 4."""
    ptr, dtype, shape, strides = spec
    if not 1 <= len(shape) <= 4 or len(shape) != len(strides):
        raise ValueError("tensor spec: 1 to 4 dims, one stride per dim")
    if dtype not in (KVARN_F32, KVARN_F16, KVARN_BF16):
        raise ValueError(f"tensor spec: unknown dtype code {dtype}")
    if any(s < 0 for s in shape):
        raise ValueError(f"tensor spec: negative extent in shape {shape}")
    if ptr == 0 and all(s > 0 for s in shape):
        raise ValueError("tensor spec: null pointer")
    t.ptr = ptr
    t.dtype = dtype
    t.ndim = len(shape)
    cdef int i
    for i in range(4):
        t.shape[i] = shape[i] if i < len(shape) else 1
        t.stride[i] = strides[i] if i < len(shape) else 0
    return 0


cdef int fill_cache(kvarn_cuda_cache* c, dict d) except -1:
    c.kbits = d["kbits"]
    c.vbits = d["vbits"]
    c.group = d["group"]
    c.head_dim = d["head_dim"]
    c.num_kv_heads = d["num_kv_heads"]
    c.num_layers = d["num_layers"]
    c.num_slots = d["num_slots"]
    c.sink_cap = d["sink_cap"]
    c.max_tiles = d["max_tiles"]
    c.num_pages = d["num_pages"]
    c.pool = d["pool"]
    c.sink_k = d["sink_k"]
    c.sink_v = d["sink_v"]
    c.tail_k = d["tail_k"]
    c.tail_v = d["tail_v"]
    c.block_table = d["block_table"]
    return 0


def last_error():
    return kvarn_cuda_last_error().decode()


def device_count():
    cdef int32_t n = 0
    rc = kvarn_cuda_device_count(&n)
    return rc, n


def device_props(int device):
    cdef int64_t p[5]
    rc = kvarn_cuda_device_props(device, p)
    return rc, dict(multiprocessors=p[0], major=p[1], minor=p[2], max_smem_optin=p[3], l2_bytes=p[4])


def set_device(int device):
    return kvarn_cuda_set_device(device)


def get_device():
    cdef int32_t d = 0
    rc = kvarn_cuda_get_device(&d)
    return rc, d


def malloc(size_t nbytes):
    cdef uintptr_t p = 0
    rc = kvarn_cuda_malloc(&p, nbytes)
    return rc, p


def free(uintptr_t ptr):
    return kvarn_cuda_free(ptr)


def memset(uintptr_t ptr, int value, size_t nbytes, uintptr_t stream):
    return kvarn_cuda_memset(ptr, value, nbytes, stream)


def memcpy_htod(uintptr_t dst, const unsigned char[::1] src, uintptr_t stream):
    if src.shape[0] == 0:
        return 0
    with nogil:
        rc = kvarn_cuda_memcpy_htod(dst, &src[0], src.shape[0], stream)
    return rc


def memcpy_dtoh(unsigned char[::1] dst, uintptr_t src, uintptr_t stream):
    if dst.shape[0] == 0:
        return 0
    with nogil:
        rc = kvarn_cuda_memcpy_dtoh(&dst[0], src, dst.shape[0], stream)
    return rc


def memcpy_dtod(uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t stream):
    return kvarn_cuda_memcpy_dtod(dst, src, nbytes, stream)


def memcpy_2d_dtod(uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch, size_t width, size_t height,
                   uintptr_t stream):
    if width == 0 or height == 0:
        return 0
    if width > dpitch or width > spitch:  # cudaMemcpy2D's own rule, checked here for a clear status
        return KVARN_CUDA_ERR_ARGUMENT
    return kvarn_cuda_memcpy_2d_dtod(dst, dpitch, src, spitch, width, height, stream)


def stream_sync(uintptr_t stream):
    with nogil:
        rc = kvarn_cuda_stream_sync(stream)
    return rc


def record_layout(int kbits, int vbits, int group, int head_dim):
    cdef int64_t o[9]
    if kvarn_cuda_layout(kbits, vbits, group, head_dim, o) != 0:
        return None
    return dict(k_codes=o[0], ka=o[1], kz=o[2], kt=o[3], v_codes=o[4], vc=o[5], va=o[6], vz=o[7], total=o[8])


def format_supported(int kbits, int vbits, int group, int head_dim):
    return bool(kvarn_cuda_format_supported(kbits, vbits, group, head_dim))


def check_many(tuple xs, tuple bits, uintptr_t flag, uintptr_t stream):
    """The NaN/Inf and fp16-range check of up to MAX_CHECKS tensors in one launch: xs[i] with bits[i] = (NaN/Inf
    bit, range bit; 0: no range check), ORed into the int32 at flag."""
    cdef kvarn_cuda_tensor t[KVARN_CUDA_MAX_CHECKS]
    cdef int32_t b[2 * KVARN_CUDA_MAX_CHECKS]
    cdef int i, n = len(xs)
    if not 1 <= n <= KVARN_CUDA_MAX_CHECKS or len(bits) != n:
        raise ValueError(f"check_many: 1 to {KVARN_CUDA_MAX_CHECKS} tensors with one (NaN/Inf, range) bit pair each")
    for i in range(n):
        fill_tensor(&t[i], xs[i])
        b[2 * i], b[2 * i + 1] = bits[i]
    return kvarn_cuda_check_many(t, b, n, flag, stream)


cdef int check_kv(const kvarn_cuda_cache* c, const kvarn_cuda_tensor* k, const kvarn_cuda_tensor* v,
                  int64_t batch) except -1:
    """k, v [>= batch, T, num_kv_heads, head_dim], the same shape: what the kernels index."""
    cdef int i
    if k.ndim != 4 or v.ndim != 4:
        raise ValueError("k, v: expected 4-D tensors [B, T, Hk, D]")
    for i in range(4):
        if k.shape[i] != v.shape[i]:
            raise ValueError("k, v: shapes differ")
    if k.shape[0] < batch or k.shape[2] != c.num_kv_heads or k.shape[3] != c.head_dim:
        raise ValueError(f"k, v: shape ({k.shape[0]}, {k.shape[1]}, {k.shape[2]}, {k.shape[3]}) does not hold "
                         f"{batch} sequences of {c.num_kv_heads} kv heads x {c.head_dim}")
    return 0


def write_tokens(dict cache, int layer, tuple k, tuple v, uintptr_t meta, size_t meta_bytes, int batch,
                 uintptr_t flag, uintptr_t stream):
    """meta: int32 [batch][3] in a device buffer of meta_bytes bytes."""
    cdef kvarn_cuda_cache c
    cdef kvarn_cuda_tensor tk, tv
    fill_cache(&c, cache)
    fill_tensor(&tk, k)
    fill_tensor(&tv, v)
    check_kv(&c, &tk, &tv, batch)
    if not 0 <= layer < c.num_layers:
        raise ValueError(f"layer: {layer} is outside [0, {c.num_layers})")
    if batch < 0 or <size_t>batch * 3 * 4 > meta_bytes:
        raise ValueError(f"meta: {meta_bytes} bytes cannot hold {batch} rows of 3 int32")
    return kvarn_cuda_write_tokens(&c, layer, &tk, &tv, meta, batch, flag, stream)


def store(dict cache, tuple k, tuple v, uintptr_t jobs, size_t jobs_bytes, int n_jobs, int iters, bint round_f16,
          uintptr_t flag, uintptr_t stream):
    """jobs: int32 [n_jobs][7] in a device buffer of jobs_bytes bytes."""
    cdef kvarn_cuda_cache c
    cdef kvarn_cuda_tensor tk, tv
    fill_cache(&c, cache)
    fill_tensor(&tk, k)
    fill_tensor(&tv, v)
    check_kv(&c, &tk, &tv, 0)
    if n_jobs < 0 or <size_t>n_jobs * 7 * 4 > jobs_bytes:
        raise ValueError(f"jobs: {jobs_bytes} bytes cannot hold {n_jobs} rows of 7 int32")
    return kvarn_cuda_store(&c, &tk, &tv, jobs, n_jobs, iters, round_f16, flag, stream)


def attend_scratch_bytes(int batch, int num_q_heads, int head_dim, int splits):
    return kvarn_cuda_attend_scratch(batch, num_q_heads, head_dim, splits)


def attend(dict cache, int layer, uintptr_t meta, size_t meta_bytes, int batch, tuple q, int num_q_heads,
           double scale, tuple out, uintptr_t scratch, size_t scratch_bytes, int splits, int tiles_per_split,
           int q_rows, uintptr_t stream):
    """meta: int32 [batch][4] in meta_bytes; q, out [batch, num_q_heads, head_dim], or [S, T, num_q_heads,
    head_dim] with S x T = batch (meta row s * T + t: token t of sequence s); scratch: scratch_bytes; q_rows: 4 or 8
    query rows per program."""
    cdef kvarn_cuda_cache c
    cdef kvarn_cuda_tensor tq, to
    cdef int i
    fill_cache(&c, cache)
    fill_tensor(&tq, q)
    fill_tensor(&to, out)
    if tq.ndim not in (3, 4) or to.ndim != tq.ndim:
        raise ValueError("q, out: expected 3-D tensors [B, Hq, D] or 4-D [S, T, Hq, D], both alike")
    rows = tq.shape[0] if tq.ndim == 3 else tq.shape[0] * tq.shape[1]
    heads, dim = (tq.shape[1], tq.shape[2]) if tq.ndim == 3 else (tq.shape[2], tq.shape[3])
    if (rows, heads, dim) != (batch, num_q_heads, c.head_dim) or (tq.ndim == 4 and tq.shape[1] < 1):
        shape = [tq.shape[i] for i in range(tq.ndim)]  # a list comprehension: no closure over tq
        raise ValueError(f"q: shape {tuple(shape)} does not give {batch} rows of ({num_q_heads}, {c.head_dim})")
    for i in range(tq.ndim):
        if to.shape[i] != tq.shape[i]:
            raise ValueError("out: shape differs from q's")
    if not 0 <= layer < c.num_layers:
        raise ValueError(f"layer: {layer} is outside [0, {c.num_layers})")
    if batch <= 0 or <size_t>batch * 4 * 4 > meta_bytes:
        raise ValueError(f"meta: {meta_bytes} bytes cannot hold {batch} rows of 4 int32")
    if splits < 1 or num_q_heads < 1 or kvarn_cuda_attend_scratch(batch, num_q_heads, c.head_dim, splits) > scratch_bytes:
        raise ValueError(f"scratch: {scratch_bytes} bytes are too few for {splits} splits")
    if not (-3.4028234663852886e38 <= scale <= 3.4028234663852886e38):  # also NaN
        raise ValueError("scale: not a finite float32")
    if q_rows not in (4, 8):
        raise ValueError(f"q_rows: {q_rows} query rows per program; the kernels take 4 or 8")
    return kvarn_cuda_attend(&c, layer, meta, batch, &tq, num_q_heads, scale, &to, scratch, splits,
                             tiles_per_split, q_rows, stream)


# ---- events and capture state (runtime calls; the codes are cudaError_t, 0 = success) -----------
cdef int runtime_status(cudaError_t err):
    """0, or the error code after clearing it: a failure here must not surface later in the
    caller's own error check (torch reads cudaGetLastError after its kernels)."""
    if err != cudaSuccess:
        cudaGetLastError()
    return <int>err


def runtime_error(int code):
    return f"{cudaGetErrorName(<cudaError_t>code).decode()}: {cudaGetErrorString(<cudaError_t>code).decode()}"


def event_create():
    """A reusable event without timing (cudaEventDisableTiming = 2)."""
    cdef cudaEvent_t e = NULL
    rc = runtime_status(cudaEventCreateWithFlags(&e, 2))
    return rc, <uintptr_t>e


def event_destroy(uintptr_t event):
    return runtime_status(cudaEventDestroy(<cudaEvent_t>event))


def event_record(uintptr_t event, uintptr_t stream):
    return runtime_status(cudaEventRecord(<cudaEvent_t>event, <cudaStream_t>stream))


def event_sync(uintptr_t event):
    cdef cudaError_t err
    with nogil:
        err = cudaEventSynchronize(<cudaEvent_t>event)
    return runtime_status(err)


def stream_wait_event(uintptr_t stream, uintptr_t event):
    return runtime_status(cudaStreamWaitEvent(<cudaStream_t>stream, <cudaEvent_t>event, 0))


def stream_capturing(uintptr_t stream):
    """(status, capturing): whether work on the stream is being captured into a CUDA graph."""
    cdef cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone
    rc = runtime_status(cudaStreamIsCapturing(<cudaStream_t>stream, &st))
    return rc, st != cudaStreamCaptureStatusNone


def pointer_device(uintptr_t ptr):
    """(status, memory type, device) of a pointer; cudaMemoryType: 0 unregistered (not CUDA memory),
    1 host, 2 device, 3 managed. __cuda_array_interface__ does not say which GPU its pointer is on."""
    cdef cudaPointerAttributes a
    a.type = cudaMemoryTypeUnregistered
    a.device = -1
    rc = runtime_status(cudaPointerGetAttributes(&a, <const void*>ptr))
    return rc, <int>a.type, a.device
