# Declarations of the C ABI in include/kvarn/kvarn.h.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t

cdef extern from "kvarn/kvarn.h" nogil:
    enum kvarn_status:
        KVARN_OK
        KVARN_ERR_ARGUMENT
        KVARN_ERR_OVERFLOW
        KVARN_ERR_ISA
        KVARN_ERR_INTERNAL

    ctypedef struct kvarn_record_layout:
        size_t k_codes, ka, kz, kt, v_codes, vc, va, vz, total

    kvarn_record_layout kvarn_layout(int kbits, int vbits, int group, int head_dim)

    const char* kvarn_active_isa()
    int kvarn_isa_available(const char* name)
    int kvarn_set_isa(const char* name)
    const char* kvarn_isa_error()
    int kvarn_set_score_mode(int32_t mode)
    int kvarn_score_mode()
    int kvarn_cpu_has_vnni()
    int kvarn_cpu_has_avx_vnni()
    void kvarn_set_vnni(int32_t on)
    int kvarn_vnni()
    int kvarn_cpu_has_vbmi()
    void kvarn_set_vbmi(int32_t on)
    int kvarn_vbmi()

    int kvarn_hadamard_f32(float* x, int64_t rows, int32_t head_dim)
    int kvarn_hadamard_f64(double* x, int64_t rows, int32_t head_dim)
    int kvarn_quantize_tiles(const float* k, const float* v, int64_t n_tiles, int32_t kbits,
                             int32_t vbits, int32_t group, int32_t head_dim, int32_t iters,
                             uint8_t* records, int32_t num_threads, int64_t* bad_tile)
    enum:
        KVARN_INPUT_F32
        KVARN_INPUT_F16
        KVARN_INPUT_F32_AS_F16
    int kvarn_quantize_tiles_typed(const void* k, const void* v, int32_t input_type, int64_t n_tiles,
                                   int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim,
                                   int32_t iters, uint8_t* records, int32_t num_threads, int64_t* bad_tile)
    int kvarn_dequantize_tiles(const uint8_t* records, int64_t n_tiles, int32_t kbits, int32_t vbits,
                               int32_t group, int32_t head_dim, float* k, float* v)

    ctypedef struct kvarn_cache_view:
        int32_t num_kv_heads, head_dim, group, kbits, vbits
        const uint16_t* sink_k
        const uint16_t* sink_v
        int64_t sink_len, sink_head_stride, sink_row_stride
        const uint8_t* records
        int64_t num_tiles, record_tile_stride, record_head_stride
        const uint16_t* tail_k
        const uint16_t* tail_v
        int64_t tail_len, tail_head_stride, tail_row_stride

    int kvarn_attend(const kvarn_cache_view* caches, int32_t batch, const float* q,
                     int32_t num_q_heads, float scale, float* out, int32_t num_threads)
    int kvarn_attend_tokens(const kvarn_cache_view* caches, int32_t batch, int32_t n_tokens, const float* q,
                            int32_t num_q_heads, float scale, float* out, int32_t num_threads)
    int kvarn_balance(const float* x, int32_t rows, int32_t cols, int32_t iters, float* r, float* c)
    int kvarn_scan_f32(const float* x, const int64_t* shape, const int64_t* x_strides, float* max_abs,
                       uint16_t* out, const int64_t* out_strides, float f16_limit)
    int kvarn_scan_f16(const uint16_t* x, const int64_t* shape, const int64_t* x_strides, float* max_abs,
                       uint16_t* out, const int64_t* out_strides)
    int32_t kvarn_default_threads()
    int kvarn_testing_pool_fault(int64_t n_items, int32_t num_threads, int32_t fault_on_helper,
                                 int64_t* finished, int32_t* faulted)
    int kvarn_testing_pool_wake_runs(int64_t size_bytes, int64_t* alone, int64_t* woken)
    int kvarn_testing_wake_choice(int64_t n_jobs, const double* alone_ns_per_byte, const double* woken_ns_per_byte,
                                  int8_t* woke)
