# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over the C ABI. Shapes, dtypes and friendly errors live in
kvarn/_ops.py; here we only take typed buffers, release the GIL and return
the native status code (0 = ok). Each wrapper still checks that its buffers are
as large as the native code will read or write (ValueError otherwise): a caller
that skipped _ops must get an exception, never a read out of bounds."""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport malloc, free
from libc.string cimport strchr
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT

OK = KVARN_OK
ERR_ARGUMENT = KVARN_ERR_ARGUMENT
ERR_OVERFLOW = KVARN_ERR_OVERFLOW
ERR_ISA = KVARN_ERR_ISA
ERR_INTERNAL = KVARN_ERR_INTERNAL


def record_layout(int kbits, int vbits, int group, int head_dim):
    cdef kvarn_record_layout L = kvarn_layout(kbits, vbits, group, head_dim)
    return dict(k_codes=L.k_codes, ka=L.ka, kz=L.kz, kt=L.kt, v_codes=L.v_codes,
                vc=L.vc, va=L.va, vz=L.vz, total=L.total)


def active_isa():
    return kvarn_active_isa().decode(errors="replace")


def isa_available(str name):
    return bool(kvarn_isa_available(name.encode()))


def set_isa(str name):
    return kvarn_set_isa(name.encode())


def isa_error():
    return kvarn_isa_error().decode(errors="replace")  # it quotes KVARN_ISA, which may hold any bytes


SCORE_MODES = ("float", "int16", "int8")


def set_score_mode(str mode):
    """0 on success; ERR_ISA when no kernel table here runs it; ERR_ARGUMENT for an unknown mode."""
    if mode not in SCORE_MODES:
        return KVARN_ERR_ARGUMENT
    return kvarn_set_score_mode(SCORE_MODES.index(mode))


def score_mode():
    return SCORE_MODES[kvarn_score_mode()]


def cpu_has_vnni():
    return bool(kvarn_cpu_has_vnni())


def cpu_has_avx_vnni():
    return bool(kvarn_cpu_has_avx_vnni())


def set_vnni(bint on):
    """False: the integer kernels use their vpmaddwd / vpmaddubsw forms even where the CPU has
    VNNI (tests, A/B timings; avx512's int8 then runs as int16); True: VNNI where the CPU has it
    (the default)."""
    kvarn_set_vnni(on)


def vnni():
    """Whether the active kernels use VNNI instructions now."""
    return bool(kvarn_vnni())


def cpu_has_vbmi():
    return bool(kvarn_cpu_has_vbmi())


def set_vbmi(bint on):
    """False: the avx512 kernels lay out the 2-bit value codes as AVX-512 CPUs without VBMI do
    (bit-identical results; tests, A/B timings); True: VBMI's byte permutes where the CPU has
    them (the default)."""
    kvarn_set_vbmi(on)


def vbmi():
    """Whether the active kernels use VBMI's byte permutes now."""
    return bool(kvarn_vbmi())


def default_threads():
    return kvarn_default_threads()


def hadamard_f32(float[:, ::1] x, int head_dim):
    cdef int rc
    if x.shape[1] != head_dim:  # the core transforms rows of head_dim values
        raise ValueError(f"hadamard_f32: x's rows hold {x.shape[1]} values, not head_dim={head_dim}")
    with nogil:
        rc = kvarn_hadamard_f32(&x[0, 0] if x.shape[0] else NULL, x.shape[0], head_dim)
    return rc


def hadamard_f64(double[:, ::1] x, int head_dim):
    cdef int rc
    if x.shape[1] != head_dim:  # the core transforms rows of head_dim values
        raise ValueError(f"hadamard_f64: x's rows hold {x.shape[1]} values, not head_dim={head_dim}")
    with nogil:
        rc = kvarn_hadamard_f64(&x[0, 0] if x.shape[0] else NULL, x.shape[0], head_dim)
    return rc


def balance(const float[:, ::1] x, int iters, float[::1] r, float[::1] c):
    cdef int rc
    if r.shape[0] != x.shape[0] or c.shape[0] != x.shape[1]:
        raise ValueError("balance: r, c do not match x's rows, columns")
    with nogil:
        rc = kvarn_balance(&x[0, 0], <int32_t>x.shape[0], <int32_t>x.shape[1], iters, &r[0], &c[0])
    return rc


def quantize_tiles(const float[:, :, ::1] k, const float[:, :, ::1] v, int kbits, int vbits,
                   int iters, uint8_t[:, ::1] records, int num_threads, bint round_to_f16=False):
    """k, v: [n_tiles, G, D]; round_to_f16: quantise the values rounded to fp16
    (KVARN_INPUT_F32_AS_F16). Returns (status, first bad tile)."""
    cdef int rc
    cdef int64_t bad = -1
    cdef int64_t n = k.shape[0]
    cdef int32_t input_type = KVARN_INPUT_F32_AS_F16 if round_to_f16 else KVARN_INPUT_F32
    _check_tiles(k.shape, v.shape, records.shape, kbits, vbits, "quantize_tiles")
    if n == 0:
        return 0, -1
    _check_records_aligned(&records[0, 0], "quantize_tiles")
    with nogil:
        rc = kvarn_quantize_tiles_typed(&k[0, 0, 0], &v[0, 0, 0], input_type, n, kbits, vbits, <int32_t>k.shape[1],
                                        <int32_t>k.shape[2], iters, &records[0, 0], num_threads, &bad)
    return rc, bad


def quantize_tiles_f16(const uint16_t[:, :, ::1] k, const uint16_t[:, :, ::1] v, int kbits, int vbits,
                       int iters, uint8_t[:, ::1] records, int num_threads):
    """quantize_tiles for fp16 tiles (k, v: [n_tiles, G, D] float16 viewed as uint16)."""
    cdef int rc
    cdef int64_t bad = -1
    cdef int64_t n = k.shape[0]
    _check_tiles(k.shape, v.shape, records.shape, kbits, vbits, "quantize_tiles_f16")
    if n == 0:
        return 0, -1
    _check_records_aligned(&records[0, 0], "quantize_tiles_f16")
    with nogil:
        rc = kvarn_quantize_tiles_typed(&k[0, 0, 0], &v[0, 0, 0], KVARN_INPUT_F16, n, kbits, vbits,
                                        <int32_t>k.shape[1], <int32_t>k.shape[2], iters, &records[0, 0],
                                        num_threads, &bad)
    return rc, bad


def dequantize_tiles(const uint8_t[:, ::1] records, int kbits, int vbits,
                     float[:, :, ::1] k, float[:, :, ::1] v):
    cdef int rc
    cdef int64_t n = records.shape[0]
    _check_same(k.shape, v.shape, 3, "dequantize_tiles: k and v")
    if k.shape[0] != n or (n and records.shape[1] != _record_total(kbits, vbits, k.shape[1], k.shape[2])):
        raise ValueError("dequantize_tiles: records do not match the output buffers' format")
    if n == 0:
        return 0
    with nogil:  # no alignment needed: the C code reads the records' fp16 fields with memcpy
        rc = kvarn_dequantize_tiles(&records[0, 0], n, kbits, vbits, <int32_t>k.shape[1],
                                    <int32_t>k.shape[2], &k[0, 0, 0], &v[0, 0, 0])
    return rc


cdef int _check_records_aligned(const uint8_t* records, str what) except -1:
    """Records hold fp16 fields read as uint16: the C ABI requires 2-byte alignment (numpy's own
    allocations have it; a view starting at an odd byte does not)."""
    if (<size_t>records) % 2:
        raise ValueError(what + ": records buffer is not 2-byte aligned")
    return 0


cdef int _check_tiles(Py_ssize_t* k, Py_ssize_t* v, Py_ssize_t* records, int kbits, int vbits, str what) except -1:
    """k, v [n, G, D] alike, records [n, record bytes] of that format (the buffers the quantiser reads and writes)."""
    _check_same(k, v, 3, what + ": k and v")
    if records[0] != k[0] or (k[0] and records[1] != _record_total(kbits, vbits, k[1], k[2])):
        raise ValueError(what + ": records buffer does not fit the tiles")
    return 0


cdef int _check_same(Py_ssize_t* a, Py_ssize_t* b, int ndim, str what) except -1:
    for i in range(ndim):
        if a[i] != b[i]:
            raise ValueError(f"{what} differ in shape")
    return 0


def _record_total(int kbits, int vbits, Py_ssize_t group, Py_ssize_t head_dim):
    """Bytes of one record, or -1 for a format the core rejects anyway (its status says so)."""
    if not (0 < group <= 1 << 16 and 0 < head_dim <= 1 << 16):
        return -1
    return kvarn_layout(kbits, vbits, <int32_t>group, <int32_t>head_dim).total


cdef int _buffer3(object obj, Py_ssize_t itemsize, const char* formats, Py_ssize_t* shape, const void** data,
                  str what) except -1:
    """obj's C-contiguous 3-D buffer of itemsize-byte items, its format one of the characters in formats: its
    shape, and its data (NULL when empty). Released at once, as a memoryview would be: the caller keeps obj
    alive (numpy's memory does not move). One buffer request and no memoryview object: about half the cost."""
    cdef Py_buffer b
    cdef int i
    PyObject_GetBuffer(obj, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    try:
        if b.ndim != 3 or b.itemsize != itemsize or b.format == NULL or b.format[0] == 0 or b.format[1] != 0 \
                or strchr(formats, b.format[0]) == NULL:
            raise ValueError(f"cache view: {what} must be a C-contiguous 3-D array of {itemsize}-byte items "
                             f"(format {formats.decode()}), got format {(b.format or b'?').decode(errors='replace')}, "
                             f"{b.ndim} dimensions")
        for i in range(3):
            shape[i] = b.shape[i]
        data[0] = b.buf if b.len else NULL
    finally:
        PyBuffer_Release(&b)
    return 0


cdef class CacheView:
    """One cache state as the native attend reads it (a kvarn_cache_view), checked once: KVCache and FP16Cache
    build one per state, so a decode loop's attend passes it without looking up buffers or dict entries again.
    Holds the arrays it points into. Arguments as the parts dicts' entries (fp16 arrays as float16 or their
    uint16 bits); a wrong view raises ValueError, never reads out of bounds."""
    cdef kvarn_cache_view view
    cdef tuple arrays
    cdef readonly bint empty

    def __cinit__(self, int32_t num_kv_heads, int32_t head_dim, int32_t group, int32_t kbits, int32_t vbits,
                  sink_k, sink_v, int64_t sink_len, records, int64_t num_tiles, tail_k, tail_v, int64_t tail_len):
        cdef Py_ssize_t sk[3]
        cdef Py_ssize_t sv[3]
        cdef Py_ssize_t rec[3]
        cdef Py_ssize_t tk[3]
        cdef Py_ssize_t tv[3]
        cdef kvarn_cache_view* c = &self.view
        self.arrays = (sink_k, sink_v, records, tail_k, tail_v)  # the objects read below, kept alive
        _buffer3(sink_k, 2, b"eH", sk, <const void**>&c.sink_k, "sink_k")
        _buffer3(sink_v, 2, b"eH", sv, <const void**>&c.sink_v, "sink_v")
        _buffer3(records, 1, b"B", rec, <const void**>&c.records, "records")
        _buffer3(tail_k, 2, b"eH", tk, <const void**>&c.tail_k, "tail_k")
        _buffer3(tail_v, 2, b"eH", tv, <const void**>&c.tail_v, "tail_v")
        # Bounds of every length against its buffer: a wrong view must raise, never read out of bounds.
        if not (0 <= sink_len <= sk[1] and 0 <= tail_len <= tk[1] and 0 <= num_tiles <= rec[0]):
            raise ValueError("cache view: a length exceeds its buffer")
        if sv[0] != sk[0] or sv[1] != sk[1] or sv[2] != sk[2] or tv[0] != tk[0] or tv[1] != tk[1] or tv[2] != tk[2]:
            raise ValueError("cache view: K and V buffers differ in shape")
        if sk[0] != num_kv_heads or tk[0] != num_kv_heads or rec[1] != num_kv_heads or sk[2] != head_dim \
                or tk[2] != head_dim:
            raise ValueError("cache view: buffer shapes do not match heads/head_dim")
        if rec[0] and rec[2] != kvarn_layout(kbits, vbits, group, head_dim).total:
            raise ValueError("cache view: record size does not match the format")
        if c.records != NULL:
            _check_records_aligned(c.records, "cache view")
        c.num_kv_heads = num_kv_heads
        c.head_dim = head_dim
        c.group = group
        c.kbits = kbits
        c.vbits = vbits
        c.sink_len = sink_len
        c.sink_head_stride = sk[1] * sk[2]
        c.sink_row_stride = sk[2]
        c.num_tiles = num_tiles
        c.record_tile_stride = rec[1] * rec[2]
        c.record_head_stride = rec[2]
        c.tail_len = tail_len
        c.tail_head_stride = tk[1] * tk[2]
        c.tail_row_stride = tk[2]
        self.empty = sink_len + num_tiles + tail_len == 0


def cache_view(dict parts):
    """A CacheView of a parts dict (KVCache._native_parts())."""
    return CacheView(parts["num_kv_heads"], parts["head_dim"], parts["group"], parts["kbits"], parts["vbits"],
                     parts["sink_k"], parts["sink_v"], parts["sink_len"], parts["records"], parts["num_tiles"],
                     parts["tail_k"], parts["tail_v"], parts["tail_len"])


def attend(list parts, const float[:, :, ::1] q, float scale, float[:, :, ::1] out, int num_threads,
           int n_tokens=1):
    """parts: one CacheView, or a parts dict (see cache_view), per sequence; q, out: [batch, n_tokens * Hq, D],
    each sequence's last n_tokens tokens' queries, token-major (kvarn_attend_tokens)."""
    cdef int batch = len(parts)
    cdef int rc
    cdef int i
    cdef CacheView view
    if q.shape[0] != batch or out.shape[0] != batch or out.shape[1] != q.shape[1] or out.shape[2] != q.shape[2]:
        raise ValueError("attend: q and out must both be [batch, n_tokens * Hq, D]")
    if n_tokens < 1 or q.shape[1] % n_tokens:
        raise ValueError("attend: q's rows are not n_tokens tokens' heads")
    cdef int num_q_heads = q.shape[1] // n_tokens
    views = [p if type(p) is CacheView else cache_view(p) for p in parts]  # held until the call returns
    cdef kvarn_cache_view* c_views = <kvarn_cache_view*>malloc(batch * sizeof(kvarn_cache_view))
    if c_views == NULL:
        raise MemoryError()
    try:
        for i in range(batch):
            view = views[i]
            c_views[i] = view.view
            if c_views[i].head_dim != q.shape[2] or num_q_heads % c_views[i].num_kv_heads:
                raise ValueError("attend: q's heads / head_dim do not match a cache view")
        with nogil:
            rc = kvarn_attend_tokens(c_views, batch, n_tokens, &q[0, 0, 0], num_q_heads, scale,
                                     &out[0, 0, 0], num_threads)
    finally:
        free(c_views)
    return rc


cdef bint _element_strides(const Py_ssize_t* strides, int itemsize, int64_t* out) noexcept nogil:
    """out[i] = strides[i] / itemsize; False if a stride is not a whole number of elements."""
    cdef int i
    for i in range(3):
        if strides[i] % itemsize:
            return False
        out[i] = strides[i] // itemsize
    return True


cdef int _scan_args(const Py_ssize_t* x_shape, const Py_ssize_t* x_strides, int itemsize, uint16_t[:, :, :] out,
                    int64_t* shape, int64_t* xs, int64_t* os, uint16_t** out_ptr) except -1:
    """The scans' shared arguments: x's shape and element strides, and out's (checked to be x's shape: a
    ValueError) with its first element when x is not empty. 1 when a stride is not a whole number of
    elements (the caller returns KVARN_ERR_ARGUMENT), else 0."""
    cdef int i
    for i in range(3):
        shape[i] = x_shape[i]
    if not _element_strides(x_strides, itemsize, xs):
        return 1
    if out is not None:
        for i in range(3):
            if out.shape[i] != x_shape[i]:
                raise ValueError("scan: out's shape differs from x's")
        if not _element_strides(out.strides, 2, os):
            return 1
        if shape[0] and shape[1] and shape[2]:
            out_ptr[0] = &out[0, 0, 0]
    return 0


def scan_f32(const float[:, :, :] x not None, uint16_t[:, :, :] out=None, float f16_limit=0.0):
    """(status, max |x|) of a float32 array (NaN if it holds a NaN, inf if an Inf); with out
    (uint16 bits of an fp16 array of x's shape), also writes x's fp16 rounding there when
    max |x| <= f16_limit (see kvarn_scan_f32)."""
    cdef int64_t shape[3]
    cdef int64_t x_strides[3]
    cdef int64_t out_strides[3]
    cdef float max_abs = 0.0
    cdef int rc
    cdef uint16_t* out_ptr = NULL
    cdef const float* x_ptr = NULL
    if _scan_args(x.shape, x.strides, 4, out, shape, x_strides, out_strides, &out_ptr):
        return KVARN_ERR_ARGUMENT, 0.0
    if shape[0] and shape[1] and shape[2]:
        x_ptr = &x[0, 0, 0]
    with nogil:
        rc = kvarn_scan_f32(x_ptr, shape, x_strides, &max_abs, out_ptr, out_strides, f16_limit)
    return rc, max_abs


def scan_f16(const uint16_t[:, :, :] x not None, uint16_t[:, :, :] out=None):
    """(status, max |x|) of an fp16 array given as its uint16 bits (NaN if it holds a NaN, inf if
    an Inf); with out (uint16, x's shape), also copies x there when it holds neither (see
    kvarn_scan_f16)."""
    cdef int64_t shape[3]
    cdef int64_t x_strides[3]
    cdef int64_t out_strides[3]
    cdef float max_abs = 0.0
    cdef int rc
    cdef uint16_t* out_ptr = NULL
    cdef const uint16_t* x_ptr = NULL
    if _scan_args(x.shape, x.strides, 2, out, shape, x_strides, out_strides, &out_ptr):
        return KVARN_ERR_ARGUMENT, 0.0
    if shape[0] and shape[1] and shape[2]:
        x_ptr = &x[0, 0, 0]
    with nogil:
        rc = kvarn_scan_f16(x_ptr, shape, x_strides, &max_abs, out_ptr, out_strides)
    return rc, max_abs


def testing_pool_fault(int64_t n_items, int num_threads, bint fault_on_helper):
    """(status, items finished when the call returned, whether an item threw): see
    kvarn_testing_pool_fault. Tests only."""
    cdef int64_t finished = 0
    cdef int32_t faulted = 0
    cdef int rc
    with nogil:
        rc = kvarn_testing_pool_fault(n_items, num_threads, fault_on_helper, &finished, &faulted)
    return rc, finished, bool(faulted)


def testing_pool_wake_runs(int64_t size_bytes):
    """(status, calls run alone, calls with the helpers woken) for attend calls of size_bytes' size class
    that found the helpers asleep: see kvarn_testing_pool_wake_runs. Tests only."""
    cdef int64_t alone = 0
    cdef int64_t woken = 0
    cdef int rc = kvarn_testing_pool_wake_runs(size_bytes, &alone, &woken)
    return rc, alone, woken


def testing_wake_choice(const double[::1] alone_ns_per_byte not None, const double[::1] woken_ns_per_byte not None,
                        int8_t[::1] woke not None):
    """status; woke[i] = 1 where a fresh wake choice woke the helpers for job i, given each job's time per
    byte either way (see kvarn_testing_wake_choice). Tests only."""
    cdef int64_t n = woke.shape[0]
    if alone_ns_per_byte.shape[0] != n or woken_ns_per_byte.shape[0] != n:
        return KVARN_ERR_ARGUMENT
    if n == 0:
        return KVARN_OK
    return kvarn_testing_wake_choice(n, &alone_ns_per_byte[0], &woken_ns_per_byte[0], &woke[0])
