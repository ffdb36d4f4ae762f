/*
 * kvarn C ABI: what the Python wrappers (and any other host) call. C99 or later, or C++.
 * The int-returning kernel and setter functions return a kvarn_status; the queries
 * (kvarn_isa_available, kvarn_score_mode, kvarn_cpu_has_*, kvarn_vnni, kvarn_vbmi) return their
 * value, kvarn_active_isa a static string. None aborts on bad arguments; a call that
 * returns KVARN_ERR_ARGUMENT or KVARN_ERR_ISA has written no output buffer.
 * Shapes are checked in Python first; the checks here are a second line of
 * defence so that native code never crashes its host. The library cannot know a
 * buffer's size: every buffer must hold what its shape says.
 *
 * Buffers: all caller-owned; the library keeps no pointer after a call returns.
 * Alignment: float arrays 4 bytes (double 8), fp16 arrays 2 bytes, bad_tile 8 bytes, and
 * every record (records pointer and record strides) 2 bytes (the scalar kernels read and
 * store fp16 fields in place) except kvarn_dequantize_tiles' input, which is read bytewise
 * and may sit anywhere; no wider alignment is needed. A misaligned pointer or record stride
 * is KVARN_ERR_ARGUMENT. Outputs must not overlap any input or each other, except
 * kvarn_hadamard_*, which work in place.
 *
 * Values: inputs must be finite (the Python layer checks). Non-finite k or v give
 * records of no meaning or KVARN_ERR_OVERFLOW, never undefined behaviour; a NaN in a
 * record's fields makes kvarn_attend return KVARN_ERR_OVERFLOW (a non-finite output) on
 * every ISA and score mode, an Inf wherever it makes the output non-finite (an infinite
 * kz or kt can instead give a token, or a tile, weight 0). In the integer score modes
 * (the default on avx2 / avx512) an infinite q*ka on 4-bit keys (an Inf in ka, or a query
 * scale that overflows it) and a negative va on 2-bit values (the quantiser writes none;
 * the integer value sums round the weights p*va against their largest) are
 * KVARN_ERR_OVERFLOW as well; other widths take the float path there.
 *
 * num_threads: <= 0 means all cores; above KVARN_MAX_THREADS is KVARN_ERR_ARGUMENT.
 *
 * Threads: kernel calls (hadamard, quantize, dequantize, attend, balance) may run
 * concurrently from any number of threads; they share one internal thread pool,
 * and a call that finds it busy runs its work on the calling thread. The settings
 * (kvarn_set_isa, kvarn_set_score_mode, kvarn_set_vnni, kvarn_set_vbmi) are process-wide and
 * thread-safe, but a call in flight on another thread may run part of its work
 * under the old setting and part under the new (results within the modes'
 * tolerance): change them when no kernel call is running. After fork() the child
 * gets a fresh thread pool.
 */
#ifndef KVARN_KVARN_H
#define KVARN_KVARN_H

#include <stddef.h>
#include <stdint.h>

#include "kvarn/format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvarn_status {
    KVARN_OK = 0,
    KVARN_ERR_ARGUMENT = 1,    /* a size, pointer or format is invalid */
    KVARN_ERR_OVERFLOW = 2,    /* a folded fp16 scale would be inf/NaN */
    KVARN_ERR_ISA = 3,         /* unknown or unsupported ISA name */
    KVARN_ERR_INTERNAL = 4     /* allocation failure or other C++ exception; outputs undefined */
} kvarn_status;

/* ---- ISA dispatch ---------------------------------------------------------- */
/* Names: "scalar", "avx2", "avx512". The active ISA is chosen once at first use
 * (cpuid + XGETBV), or from the environment variable KVARN_ISA. When KVARN_ISA names
 * an ISA that cannot run, kvarn_active_isa returns "none", kernel calls return
 * KVARN_ERR_ISA and kvarn_isa_error says why, until a kvarn_set_isa succeeds. */
const char* kvarn_active_isa(void);
/* 1 when the ISA is compiled in and this CPU and OS support it. */
int kvarn_isa_available(const char* name);
/* Switches the process-wide active ISA: KVARN_OK, or KVARN_ERR_ISA (active ISA unchanged). */
int kvarn_set_isa(const char* name);
/* Error text of the last failed kvarn_set_isa / forced KVARN_ISA ("" after a successful
 * kvarn_set_isa). Thread-safe: the text is the calling thread's copy, valid until that
 * thread's next kvarn_isa_error call; do not free it. */
const char* kvarn_isa_error(void);

/* How the SIMD attention computes q.k on 4-bit keys and p.v on 2-bit values:
 * 0 float FMA; 1 (the default) query and weights rounded to int16 per (tile,
 * head) and dotted exactly in int32 with the codes (vpdpwssd where the CPU has
 * AVX-512 VNNI resp. AVX-VNNI, else vpmaddwd + vpaddd: the same sums); 2 the query
 * in int8 and the 2-bit values' weights in uint8, coarser, the 4-bit codes centred on 7.5
 * so that most of the query's rounding cancels (the avx2 kernels: vpdpbusd with AVX-VNNI, else vpmaddubsw + vpaddw;
 * the avx512 ones: vpdpbusd with AVX-512 VNNI; without it they run int16). Environment:
 * KVARN_SCORES=float|int16|int8 (the library ignores any other value, i.e. runs int16;
 * the Python module refuses one at import). int16 or int8 without AVX2: KVARN_ERR_ISA.
 * kvarn_score_mode: the mode the active kernels run (float on the scalar kernels;
 * int16 for int8 on avx512 without VNNI). */
int kvarn_set_score_mode(int32_t mode);
int kvarn_score_mode(void);
int kvarn_cpu_has_vnni(void);
/* VNNI instructions (AVX-512 VNNI in the avx512 kernels, AVX-VNNI's VEX vpdpwssd in
 * the avx2 ones) are used where the CPU has them; kvarn_set_vnni(0) makes the integer
 * kernels use their vpmaddwd / vpmaddubsw forms (bit-identical results; avx512's int8,
 * which has no such form, then runs as int16), 1 restores the default: for tests and A/B
 * timings. kvarn_vnni: whether the active kernels use VNNI now. */
int kvarn_cpu_has_avx_vnni(void);
void kvarn_set_vnni(int32_t on);
int kvarn_vnni(void);
/* AVX-512 VBMI's byte permutes lay out the 2-bit value codes in the avx512 kernels where the CPU has
 * them (kvarn_cpu_has_vbmi); kvarn_set_vbmi(0) makes them use the form of AVX-512 CPUs without VBMI
 * (bit-identical results), 1 restores the default: for tests and A/B timings. kvarn_vbmi: whether
 * the active kernels use VBMI now. */
int kvarn_cpu_has_vbmi(void);
void kvarn_set_vbmi(int32_t on);
int kvarn_vbmi(void);

/* ---- Kernels ----------------------------------------------------------------- */
/* In place, x [rows][head_dim]: the orthonormal block Hadamard (its own inverse). x may be
 * NULL when rows is 0. */
int kvarn_hadamard_f32(float* x, int64_t rows, int32_t head_dim);
int kvarn_hadamard_f64(double* x, int64_t rows, int32_t head_dim);

/* Most balancing (Sinkhorn) iterations kvarn_quantize_tiles and kvarn_balance accept
 * (SPEC's default is KVARN_SINKHORN_ITERS); more is KVARN_ERR_ARGUMENT, so that a bad
 * value cannot stall a call for minutes. The Python layer uses the same bound. */
#define KVARN_MAX_SINKHORN_ITERS 1000
/* Most threads a num_threads argument may ask for (the Python layer's bound too). */
#define KVARN_MAX_THREADS 4096

/* k, v: [n_tiles][group][head_dim] float32, original frame. records:
 * [n_tiles][record bytes] (kvarn_layout().total each). iters in [0,
 * KVARN_MAX_SINKHORN_ITERS]. num_threads <= 0: all cores. bad_tile may be NULL; k, v and
 * records may be NULL when n_tiles is 0 (here and in kvarn_dequantize_tiles).
 * On KVARN_ERR_OVERFLOW (a tile too large for fp16 scales) *bad_tile is the first bad
 * tile and the records are not usable; the other tiles' records are written. */
int kvarn_quantize_tiles(const float* k, const float* v, int64_t n_tiles, int32_t kbits,
                         int32_t vbits, int32_t group, int32_t head_dim, int32_t iters,
                         uint8_t* records, int32_t num_threads, int64_t* bad_tile);

/* kvarn_quantize_tiles for other input formats, without a float32 copy of the input:
 * input_type KVARN_INPUT_F32 is kvarn_quantize_tiles itself; KVARN_INPUT_F16: k, v hold
 * IEEE binary16 values (uint16_t bits); KVARN_INPUT_F32_AS_F16: k, v are float32, each
 * rounded to the nearest binary16 (ties to even) first, as a cache that stores fp16 tokens
 * quantises them (|x| must stay <= 65504). The records equal kvarn_quantize_tiles' on the
 * same values in float32. Same layout, threads, returns and *bad_tile; an unknown
 * input_type is KVARN_ERR_ARGUMENT. k, v must be 2-byte (F16) or 4-byte aligned. */
enum { KVARN_INPUT_F32 = 0, KVARN_INPUT_F16 = 1, KVARN_INPUT_F32_AS_F16 = 2 };
int kvarn_quantize_tiles_typed(const void* k, const void* v, int32_t input_type, int64_t n_tiles,
                               int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim,
                               int32_t iters, uint8_t* records, int32_t num_threads,
                               int64_t* bad_tile);

/* Inverse of the above up to quantisation error: k, v written in the original frame. */
int kvarn_dequantize_tiles(const uint8_t* records, int64_t n_tiles, int32_t kbits, int32_t vbits,
                           int32_t group, int32_t head_dim, float* k, float* v);

/* A read-only view of one sequence's cache. Full-precision parts are fp16
 * (IEEE binary16 bit patterns). Strides are in elements for fp16 arrays and
 * in bytes for records. Token order: sink, then tiles, then tail.
 * KV head h, token t of the sink: sink_k + h * sink_head_stride + t * sink_row_stride
 * (head_dim elements; the tail likewise); its record i: records + h * record_head_stride
 * + i * record_tile_stride. Lengths >= 0, not all 0. A part of length 0 is not read (its
 * pointers may be NULL); otherwise its pointers are non-NULL, its strides non-negative,
 * row strides >= head_dim, record_tile_stride >= the record size (kvarn_layout().total),
 * kbits/vbits/group a supported format, and the bytes it spans fit in PTRDIFF_MAX;
 * anything else is KVARN_ERR_ARGUMENT. The tail is normally shorter than a tile, but
 * any length is attended correctly. */
typedef struct kvarn_cache_view {
    int32_t num_kv_heads, head_dim, group, kbits, vbits;
    const uint16_t* sink_k;
    const uint16_t* sink_v;
    int64_t sink_len, sink_head_stride, sink_row_stride;
    const uint8_t* records;
    int64_t num_tiles, record_tile_stride, record_head_stride;
    const uint16_t* tail_k;
    const uint16_t* tail_v;
    int64_t tail_len, tail_head_stride, tail_row_stride;
} kvarn_cache_view;

/* Decode attention for `batch` sequences: q [batch][num_q_heads][head_dim]
 * float32, out the same shape. Query head h uses KV head h / (num_q_heads /
 * num_kv_heads); num_q_heads must be a multiple of num_kv_heads, and every view of
 * the batch must have the same num_kv_heads and head_dim. scale (finite) multiplies
 * q.k. num_threads <= 0: all cores. Long sequences are split into work items (about
 * eight per thread where each keeps 2,048 tokens, else at least two where each keeps
 * 512), each with its own softmax state, up to a 64 MiB budget of that state: the
 * layout (and so the output's last bits) depends on num_threads and the shapes alone.
 * KVARN_ERR_OVERFLOW: some output is not finite (float32 overflow; out is written). */
int kvarn_attend(const kvarn_cache_view* caches, int32_t batch, const float* q,
                 int32_t num_q_heads, float scale, float* out, int32_t num_threads);

/* kvarn_attend for the queries of each sequence's last n_tokens tokens (n_tokens >= 1; 1 is
 * kvarn_attend): q [batch][n_tokens][num_q_heads][head_dim] float32, out the same shape. Token
 * i's queries attend causally: to all of the sequence but its last n_tokens - 1 - i tokens, as
 * kvarn_attend would have after token i was appended. The records are read once for all the
 * tokens. Those last n_tokens - 1 tokens must lie in full precision, in the tail (and in the
 * sink while the view has no tiles): a sequence whose hidden tokens reach into a record, or
 * shorter than n_tokens, is KVARN_ERR_ARGUMENT (a caller appends up to a tile's completion,
 * attends, and attends the completing token on its own), as is n_tokens * num_q_heads above
 * INT32_MAX. With the same work split (it depends on num_threads, the shapes and n_tokens,
 * through the split-state budget alone), token i's output is bit-identical to kvarn_attend's
 * over the view cut after token i. */
int kvarn_attend_tokens(const kvarn_cache_view* caches, int32_t batch, int32_t n_tokens, const float* q,
                        int32_t num_q_heads, float scale, float* out, int32_t num_threads);

/* The balancing scales of SPEC §3 for a rows x cols float32 matrix (row-major):
 * r[rows], c[cols]; rows, cols >= 2, iters in [0, KVARN_MAX_SINKHORN_ITERS]. For tests and inspection. */
int kvarn_balance(const float* x, int32_t rows, int32_t cols, int32_t iters, float* r, float* c);

/* ---- Float32 inputs: one pass of checks, and the fp16 copy a cache stores --------------- */
/* x: float32 [shape[0]][shape[1]][shape[2]] at element strides x_strides (any sign). Writes
 * *max_abs = the largest |x| (0 when x is empty), NaN when x holds a NaN, else +Inf when it
 * holds an Inf. When out is not NULL and *max_abs <= f16_limit, also writes out (same shape,
 * element strides out_strides) = x rounded to the nearest IEEE binary16, ties to even (numpy's
 * astype(float16)); otherwise out is not written. f16_limit in [0, 65504] (the largest
 * binary16), else KVARN_ERR_ARGUMENT; likewise a negative size, a NULL max_abs, or a NULL or
 * misaligned x (4 bytes) or out (2 bytes) with elements. out must not overlap x. A decode step's
 * token takes one call per tensor where separate NaN, range and rounding passes took several.
 * Baseline code, in no ISA table: it runs also while KVARN_ISA names an ISA that cannot run. */
int kvarn_scan_f32(const float* x, const int64_t shape[3], const int64_t x_strides[3], float* max_abs,
                   uint16_t* out, const int64_t out_strides[3], float f16_limit);

/* kvarn_scan_f32 for IEEE binary16 input (x: the bit patterns, 2-byte aligned): *max_abs = the
 * largest |x| as a float (exact; NaN / +Inf as above), and x copied to out when it holds neither
 * (every finite half is in range; out must not overlap x). A half-precision model's decode token:
 * one call per tensor. */
int kvarn_scan_f16(const uint16_t* x, const int64_t shape[3], const int64_t x_strides[3], float* max_abs,
                   uint16_t* out, const int64_t out_strides[3]);

/* Threads that num_threads <= 0 stands for. */
int32_t kvarn_default_threads(void);

/* Testing hook (not for applications): runs n_items ~100 us items on the thread pool, the first
 * one run by a helper thread (fault_on_helper != 0) or by the calling thread (0) throwing a C++
 * exception. Returns KVARN_ERR_INTERNAL when it threw (*faulted = 1; 0 if no such thread ran an
 * item: one CPU, or the pool busy with another caller's job), and *finished = the items that
 * completed before the call returned (all but the thrown one: the pool, and its serial fallback,
 * run every item before reporting the error). */
int kvarn_testing_pool_fault(int64_t n_items, int32_t num_threads, int32_t fault_on_helper, int64_t* finished,
                             int32_t* faulted);

/* Testing hook (not for applications): how many attend calls reading about size_bytes bytes (the same
 * power-of-two size class) found the pool's helpers asleep after idle time and were run by the calling
 * thread alone (*alone) or with the helpers woken (*woken), as the pool chose from their past times. */
int kvarn_testing_pool_wake_runs(int64_t size_bytes, int64_t* alone, int64_t* woken);

/* Testing hook (not for applications): the pool's wake choice for one size class, fresh, over n_jobs jobs
 * that would take alone_ns_per_byte[i] run alone or woken_ns_per_byte[i] with the helpers woken: woke[i] = 1
 * where it chose to wake them (and learnt that time), else 0. */
int kvarn_testing_wake_choice(int64_t n_jobs, const double* alone_ns_per_byte, const double* woken_ns_per_byte,
                              int8_t* woke);

#ifdef __cplusplus
}
#endif

#endif /* KVARN_KVARN_H */
