# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over the C ABI. Shapes, dtypes and friendly errors live in
kvarn/_ops.py; here we only take typed buffers, release the GIL and return
the native status code (0 = ok). Each wrapper still checks that its buffers are
as large as the native code will read or write (ValueError otherwise): a caller
that skipped _ops must get an exception, never a read out of bounds."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport malloc, free

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


cdef int fill_view(kvarn_cache_view* c, dict parts) except -1:
    """parts: arrays from KVCache._native_parts(); keeps them alive in the caller."""
    cdef const uint16_t[:, :, ::1] sk = parts["sink_k"]
    cdef const uint16_t[:, :, ::1] sv = parts["sink_v"]
    cdef const uint8_t[:, :, ::1] rec = parts["records"]
    cdef const uint16_t[:, :, ::1] tk = parts["tail_k"]
    cdef const uint16_t[:, :, ::1] tv = parts["tail_v"]
    # Bounds of every length against its buffer: a wrong view must raise, never read out of bounds.
    if not (0 <= parts["sink_len"] <= sk.shape[1] and 0 <= parts["tail_len"] <= tk.shape[1]
            and 0 <= parts["num_tiles"] <= rec.shape[0]):
        raise ValueError("cache view: a length exceeds its buffer")
    if sv.shape[0] != sk.shape[0] or sv.shape[1] != sk.shape[1] or sv.shape[2] != sk.shape[2] \
            or tv.shape[0] != tk.shape[0] or tv.shape[1] != tk.shape[1] or tv.shape[2] != tk.shape[2]:
        raise ValueError("cache view: K and V buffers differ in shape")
    if sk.shape[0] != parts["num_kv_heads"] or tk.shape[0] != parts["num_kv_heads"] \
            or rec.shape[1] != parts["num_kv_heads"] or sk.shape[2] != parts["head_dim"] \
            or tk.shape[2] != parts["head_dim"]:
        raise ValueError("cache view: buffer shapes do not match heads/head_dim")
    if rec.shape[0] and rec.shape[2] != kvarn_layout(parts["kbits"], parts["vbits"], parts["group"], parts["head_dim"]).total:
        raise ValueError("cache view: record size does not match the format")
    c.num_kv_heads = parts["num_kv_heads"]
    c.head_dim = parts["head_dim"]
    c.group = parts["group"]
    c.kbits = parts["kbits"]
    c.vbits = parts["vbits"]
    c.sink_len = parts["sink_len"]
    c.sink_k = &sk[0, 0, 0] if sk.size else NULL
    c.sink_v = &sv[0, 0, 0] if sv.size else NULL
    c.sink_head_stride = sk.shape[1] * sk.shape[2]
    c.sink_row_stride = sk.shape[2]
    c.num_tiles = parts["num_tiles"]
    c.records = &rec[0, 0, 0] if rec.size else NULL
    if rec.size:
        _check_records_aligned(c.records, "cache view")
    c.record_tile_stride = rec.shape[1] * rec.shape[2]
    c.record_head_stride = rec.shape[2]
    c.tail_len = parts["tail_len"]
    c.tail_k = &tk[0, 0, 0] if tk.size else NULL
    c.tail_v = &tv[0, 0, 0] if tv.size else NULL
    c.tail_head_stride = tk.shape[1] * tk.shape[2]
    c.tail_row_stride = tk.shape[2]
    return 0


def attend(list parts, const float[:, :, ::1] q, float scale, float[:, :, ::1] out, int num_threads):
    """parts: one dict per sequence (see fill_view); q, out: [batch, Hq, D]."""
    cdef int batch = len(parts)
    cdef int rc
    cdef int i
    cdef kvarn_cache_view* views = <kvarn_cache_view*>malloc(batch * sizeof(kvarn_cache_view))
    if views == NULL:
        raise MemoryError()
    try:
        if q.shape[0] != batch or out.shape[0] != batch or out.shape[1] != q.shape[1] or out.shape[2] != q.shape[2]:
            raise ValueError("attend: q and out must both be [batch, Hq, D]")
        for i in range(batch):
            fill_view(&views[i], parts[i])
            if views[i].head_dim != q.shape[2] or q.shape[1] % views[i].num_kv_heads:
                raise ValueError("attend: q's heads / head_dim do not match a cache view")
        with nogil:
            rc = kvarn_attend(views, batch, &q[0, 0, 0], <int32_t>q.shape[1], scale,
                              &out[0, 0, 0], num_threads)
    finally:
        free(views)
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
