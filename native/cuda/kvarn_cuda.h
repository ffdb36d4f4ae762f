/*
 * kvarn CUDA C ABI: host functions the Cython wrapper (kvarn._cuda) calls.
 * Device buffers travel as raw addresses (uintptr_t) and every call takes the
 * stream to run on, so torch tensors, CuPy arrays or our own allocations all
 * work without host copies. Shapes and dtypes are checked in Python
 * (kvarn/cuda.py); the checks here only keep the kernels from faulting.
 * Every function returns 0 or a KVARN_CUDA_ERR_* code; kvarn_cuda_last_error()
 * names the CUDA failure, if any.
 */
#ifndef KVARN_CUDA_H
#define KVARN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    KVARN_CUDA_OK = 0,
    KVARN_CUDA_ERR_ARGUMENT = 1,    /* unsupported format / head_dim, bad sizes */
    KVARN_CUDA_ERR_CUDA = 2,        /* a CUDA runtime call failed: see kvarn_cuda_last_error() */
};

/* Element types of strided inputs and outputs. */
enum { KVARN_F32 = 0, KVARN_F16 = 1, KVARN_BF16 = 2 };

/* Flag bits the checking and store kernels set in a device int32. */
enum {
    KVARN_FLAG_K_NONFINITE = 1,
    KVARN_FLAG_V_NONFINITE = 2,
    KVARN_FLAG_K_RANGE = 4,      /* |k| > 65504: cannot be held in the fp16 sink/tail */
    KVARN_FLAG_V_RANGE = 8,
    KVARN_FLAG_K_SCALE_OVERFLOW = 16, /* a folded fp16 scale of a tile's keys would be inf */
    KVARN_FLAG_KEY_NORM = 32,         /* a tile's keys decode beyond sqrt(D) * 2^17 (what the q check assumes) */
    KVARN_FLAG_V_SCALE_OVERFLOW = 64  /* the same for its values */
};

/* A strided device array of up to 4 dims (strides in elements). */
typedef struct kvarn_cuda_tensor {
    uintptr_t ptr;
    int32_t dtype;
    int32_t ndim;
    int64_t shape[4];
    int64_t stride[4];
} kvarn_cuda_tensor;

/* The paged pool of one cache (all layers). Sizes in elements unless noted.
 *   pool        uint8 [num_layers][num_pages][num_kv_heads][record_bytes]
 *   sink_k/v    fp16  [num_layers][num_slots][num_kv_heads][sink_cap][head_dim]
 *   tail_k/v    fp16  [num_layers][num_slots][num_kv_heads][group][head_dim]
 *   block_table int32 [num_slots][max_tiles]   page of tile i of a slot (shared by layers) */
typedef struct kvarn_cuda_cache {
    int32_t kbits, vbits, group, head_dim, num_kv_heads;
    int32_t num_layers, num_slots, sink_cap, max_tiles, num_pages;
    uintptr_t pool, sink_k, sink_v, tail_k, tail_v, block_table;
} kvarn_cuda_cache;

const char* kvarn_cuda_last_error(void);
int kvarn_cuda_device_count(int32_t* count);
/* props: [multiprocessors, major, minor, max dynamic smem per block (bytes), L2 bytes] */
int kvarn_cuda_device_props(int32_t device, int64_t props[5]);
int kvarn_cuda_set_device(int32_t device);
int kvarn_cuda_get_device(int32_t* device);

/* Plain device memory (cudaMalloc) and copies on a stream. */
int kvarn_cuda_malloc(uintptr_t* ptr, size_t bytes);
int kvarn_cuda_free(uintptr_t ptr);
int kvarn_cuda_memset(uintptr_t ptr, int value, size_t bytes, uintptr_t stream);
int kvarn_cuda_memcpy_htod(uintptr_t dst, const void* src, size_t bytes, uintptr_t stream);
int kvarn_cuda_memcpy_dtoh(void* dst, uintptr_t src, size_t bytes, uintptr_t stream); /* synchronous */
int kvarn_cuda_memcpy_dtod(uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream);
/* height rows of width bytes each, src rows spitch bytes apart, dst rows dpitch apart (cudaMemcpy2DAsync). */
int kvarn_cuda_memcpy_2d_dtod(uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch, size_t width, size_t height,
                              uintptr_t stream);
int kvarn_cuda_stream_sync(uintptr_t stream);

/* Byte offsets of one record's fields (format.h): k_codes ka kz kt v_codes vc va vz total. */
int kvarn_cuda_layout(int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim, int64_t out[9]);
/* 1 when the GPU kernels serve this format: kbits, vbits in {2,4}, group 64/128,
 * head_dim 64/128/256, and (kbits, vbits, group) one of the presets' combinations. */
int kvarn_cuda_format_supported(int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim);

/* Checks count (1..KVARN_CUDA_MAX_CHECKS) tensors in one launch: ORs bits[2i] into *flag when xs[i] holds
 * NaN/Inf and bits[2i + 1] when |x| > 65504 (0: no range check). xs[i]: up to 4 dims, any of the three dtypes. */
#define KVARN_CUDA_MAX_CHECKS 3
int kvarn_cuda_check_many(const kvarn_cuda_tensor* xs, const int32_t* bits, int32_t count, uintptr_t flag,
                          uintptr_t stream);

/* Appends T tokens to each of B sequences of one layer, k and v [B, T, Hk, D]:
 * tokens at positions < sink go to the sink, those at positions >= first_tail go to
 * the tail, the others only reach tiles through kvarn_cuda_store. meta: device int32
 * [B][3] = {slot, length before, first_tail}. Does nothing when *flag != 0.
 * Call it after kvarn_cuda_store: completed tiles read their old rows from the tail. */
int kvarn_cuda_write_tokens(const kvarn_cuda_cache* c, int32_t layer, const kvarn_cuda_tensor* k,
                            const kvarn_cuda_tensor* v, uintptr_t meta, int32_t batch, uintptr_t flag,
                            uintptr_t stream);

/* Quantises n_jobs full tiles into records (all kv heads of each job). jobs: device
 * int32 [n_jobs][7] = {slot, layer, page, b, n_old, t0, tile_index}: rows [0, n_old)
 * come from the slot's tail, rows [n_old, G) from k/v[b, t0 + r - n_old]. When
 * block_table is set, block_table[slot][tile_index] = page, always. round_f16: round inputs
 * to fp16 first (what the tail holds). Stores nothing else when *flag holds an input flag (NONFINITE,
 * RANGE); sets KVARN_FLAG_K/V_SCALE_OVERFLOW, and KVARN_FLAG_KEY_NORM for keys beyond sqrt(D) * 2^17. */
int kvarn_cuda_store(const kvarn_cuda_cache* c, const kvarn_cuda_tensor* k, const kvarn_cuda_tensor* v,
                     uintptr_t jobs, int32_t n_jobs, int32_t iters, int32_t round_f16, uintptr_t flag,
                     uintptr_t stream);

/* Decode attention for B sequences of one layer. meta: device int32 [B][4] =
 * {slot, num_tiles, sink_len, tail_len}. q [B, Hq, D] and out [B, Hq, D] strided; or q and
 * out [S, T, Hq, D] with B = S x T: meta row s * T + t is then query token t of sequence s
 * (a multi-token step: each token's row gives the lengths that token attends to).
 * scratch: device float, at least kvarn_cuda_attend_scratch(...) bytes.
 * splits, tiles_per_split (>= 1): programs per (sequence, kv head) and the tiles each reads; q_rows (4 or 8):
 * the most query rows a program takes (a kv head's group in ceil(group / q_rows) programs). */
size_t kvarn_cuda_attend_scratch(int32_t batch, int32_t num_q_heads, int32_t head_dim, int32_t splits);
int kvarn_cuda_attend(const kvarn_cuda_cache* c, int32_t layer, uintptr_t meta, int32_t batch,
                      const kvarn_cuda_tensor* q, int32_t num_q_heads, float scale, const kvarn_cuda_tensor* out,
                      uintptr_t scratch, int32_t splits, int32_t tiles_per_split, int32_t q_rows,
                      uintptr_t stream);

#ifdef __cplusplus
}
#endif

#endif /* KVARN_CUDA_H */
