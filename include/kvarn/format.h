/*
 * kvarn tile record: the one definition of sizes, field order and bit order,
 * shared by C, C++ and CUDA (SPEC §6). Every backend reads and writes exactly
 * these bytes, so a record written by one backend decodes on every other.
 *
 * One (tile, kv-head) record, contiguous, fields in this order:
 *   K codes [D][G*kbits/8] | ka [D] f16 | kz [D] f16 | kt [G] f16 |
 *   V codes [G][D*vbits/8] | vc [D] f16 | va [G] f16 | vz [G] f16
 * K rows are channels (packed along tokens), V rows are tokens (packed along
 * channels). Code i of a row lives in byte i / (8/bits) at bit shift
 * (i % (8/bits)) * bits: for 4 bits the even index is the low nibble.
 *
 * Decoding (rotated frame, H = orthonormal block Hadamard, see hadamard):
 *   K^[t,d] = (code_k[d,t] * ka[d] + kz[d]) * kt[t]
 *   V^[t,d] = (code_v[t,d] * va[t] + vz[t]) * vc[d]
 */
#ifndef KVARN_FORMAT_H
#define KVARN_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KVARN_HD __host__ __device__ __forceinline__
#else
#define KVARN_HD static inline
#endif

#ifdef __cplusplus
#define KVARN_CONSTEXPR constexpr
#else
#define KVARN_CONSTEXPR
#endif

#define KVARN_SINKHORN_ITERS 8
#define KVARN_STD_MIN 1e-3f
#define KVARN_STD_MAX 1e3f
#define KVARN_LOG_SCALE_MIN (-0.3f)
#define KVARN_LOG_SCALE_MAX 10.0f
#define KVARN_IMBALANCE_EPS 1e-8f
#define KVARN_RTN_SCALE_MIN 1e-10f

#define KVARN_MIN_HEAD_DIM 16
#define KVARN_MAX_HEAD_DIM 1024

/* Byte offsets of each field inside one record. */
typedef struct kvarn_record_layout {
    size_t k_codes, ka, kz, kt, v_codes, vc, va, vz, total;
} kvarn_record_layout;

#if defined(__CUDACC__)
__host__ __device__ constexpr inline
#elif defined(__cplusplus)
static constexpr inline  /* internal linkage: an ISA file's out-of-line copy (-O0) must not serve the others */
#else
static inline
#endif
kvarn_record_layout kvarn_layout(int kbits, int vbits, int group, int head_dim)
{
    kvarn_record_layout L = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    size_t D = (size_t)head_dim, G = (size_t)group;
    L.k_codes = 0;
    L.ka = L.k_codes + D * (G * (size_t)kbits / 8);
    L.kz = L.ka + 2 * D;
    L.kt = L.kz + 2 * D;
    L.v_codes = L.kt + 2 * G;
    L.vc = L.v_codes + G * (D * (size_t)vbits / 8);
    L.va = L.vc + 2 * D;
    L.vz = L.va + 2 * G;
    L.total = L.vz + 2 * G;
    return L;
}

/* Bytes of one packed row of n codes at `bits` per code. */
KVARN_HD size_t kvarn_packed_row_bytes(int n, int bits) { return (size_t)n * (size_t)bits / 8; }

/* Largest power of two dividing head_dim: the block of the block-diagonal Hadamard (SPEC §2). */
KVARN_HD int kvarn_hadamard_block(int head_dim)
{
    return head_dim & (-head_dim);
}

/* head_dim is served when it is a multiple of 16 in [16, 1024]. */
KVARN_HD int kvarn_head_dim_supported(int head_dim)
{
    return head_dim >= KVARN_MIN_HEAD_DIM && head_dim <= KVARN_MAX_HEAD_DIM && head_dim % 16 == 0;
}

KVARN_HD int kvarn_bits_supported(int bits) { return bits == 2 || bits == 4 || bits == 8; }
KVARN_HD int kvarn_group_supported(int group) { return group == 64 || group == 128; }

#ifdef __cplusplus
static_assert(kvarn_layout(4, 2, 128, 128).total == 13824, "k4v2 D=G=128 record is 13,824 bytes (SPEC §6)");
static_assert(kvarn_layout(4, 4, 128, 128).total == 17920, "k4v4 D=G=128 record size");
static_assert(kvarn_layout(2, 2, 128, 128).total == 9728, "k2v2 D=G=128 record size");
static_assert(kvarn_layout(4, 2, 64, 128).total == 7296, "k4v2 G=64 D=128 record size");
static_assert(kvarn_layout(4, 2, 128, 128).v_codes == 8192 + 2 * 256 + 256, "field order");
#endif

#endif /* KVARN_FORMAT_H */
