// avx2 kernels. Assumes AVX2 + FMA + F16C (dispatch checks cpuid and XGETBV
// before this table is ever used). Built with -mavx2 -mfma -mf16c
// -ffp-contract=off: only this file gets those flags.
//
// What each kernel must match (tests/test_simd.py checks all of it):
// - hadamard_f32: bit-identical to scalar (same butterflies, same pairing, the
//   same final multiply by 1/sqrt(block)).
// - quantize_tile: codes and fp16 vectors identical to scalar (see the
//   shared quantize_simd.inc: the scalar's float products and double sums in
//   the same order, libm expf/logf for the scales, exact divisions for RTN).
// - attend_tiles / attend_dense_f16: scalar's maths reassociated (fp32 FMA,
//   blocked sums, polynomial exp with <= 2 ulp error); ~1e-6 relative.
// - the int16 and int8 score modes: the avx512 file's integer sums exactly (the
//   query and weights rounded as there), so the same scores up to q.kz's summation.
//
// Link hygiene: nothing here instantiates a header template or inline function
// that another translation unit could also emit (no <algorithm>, no std::vector,
// no <cmath> wrappers): the linker could otherwise keep this file's AVX2 copy
// for the scalar code's use. Everything is in an anonymous namespace.
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "kvarn/kernels.h"
#include "sinkhorn.h"

namespace kvarn {
namespace {

// Pulls the next record towards L1 a line at a time from inside the compute
// loops, so the misses overlap with arithmetic; records of one head are a whole
// cache row apart, beyond the reach of the hardware's stride prefetcher, and a
// burst of 200+ prefetches would only stall on the line-fill buffers.
struct Prefetcher {
    const char* p;
    const char* end;
    inline void step()
    {
        if (p < end) {
            _mm_prefetch(p, _MM_HINT_T0);
            p += 64;
        }
    }
};

// ---- vector helpers --------------------------------------------------------------
inline float hsum(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

inline float hmax(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

// exp(x) for x <= 0 (softmax): Cephes-style range reduction x = n ln2 + r,
// |r| <= ln2/2, degree-6 polynomial, 2^n by exponent arithmetic. Measured max
// relative error vs double exp on [-87, 0]: < 2.5e-7 (about 2 ulp). Below
// -87.3 (where exp < FLT_MIN) returns 0. NaN stays NaN (max/min return their second
// operand when one is NaN), so a corrupt record's NaN reaches the output's finiteness check.
inline __m256 exp_ps(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3365447505531f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// exp(x) for x <= 0 in the int16 mode, whose weights are rounded to 15 bits anyway:
// the avx512 file's 2^(x log2 e) with the same degree-5 polynomial for 2^f (<= 2.4e-7
// relative, plus |x| (2^-24 + 1.34e-8) from rounding x log2 e and the fp32 log2 e; a
// review measured every float in [-87.5, 0]: within that); 2^n built in the exponent bits
// (exact for n >= -126; below that the result is 0, where avx512's vscalefps would
// give a subnormal that the int16 weights round away). NaN stays NaN, as in exp_ps.
inline __m256 exp_int_mode_ps(__m256 x)
{
    const __m256 t = _mm256_max_ps(_mm256_set1_ps(-127.0f), _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 y = _mm256_set1_ps(1.327647129073739e-3f);
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(9.675541892647743e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.550713092088699e-2f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.4022120237350464e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(6.931469440460205e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.0000001192092896f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 under = _mm256_cmp_ps(t, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// qmax / max, the factor that rounds values up to max to integers up to qmax. 0 (every integer 0) for max <= 0,
// NaN, or below ~1e-34, where the quotient is inf and inf (or 0 * inf) products would convert to INT_MIN:
// values that small add nothing next to the softmax's largest weight (1) and the query's other tiles.
inline float inverse_scale(float qmax, float max)
{
    const float inv = qmax / max;
    return max > 0.0f && inv <= FLT_MAX ? inv : 0.0f;
}

inline void f16_to_f32(const uint16_t* src, float* dst, int n)  // n % 8 == 0
{
    for (int i = 0; i < n; i += 8)
        _mm256_store_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
}

// 16 codes of a packed row starting at code i0 (a multiple of 16), as floats.
template <int B>
inline void codes16(const uint8_t* row, int i0, __m256& c0, __m256& c1);

template <>
inline void codes16<2>(const uint8_t* row, int i0, __m256& c0, __m256& c1)
{
    uint32_t w;
    memcpy(&w, row + i0 / 4, 4);
    const __m256i x = _mm256_set1_epi32((int)w), m = _mm256_set1_epi32(3);
    c0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(x, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), m));
    c1 = _mm256_cvtepi32_ps(
        _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)), m));
}

template <>
inline void codes16<4>(const uint8_t* row, int i0, __m256& c0, __m256& c1)
{
    uint32_t w[2];
    memcpy(w, row + i0 / 2, 8);
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), m = _mm256_set1_epi32(15);
    c0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w[0]), sh), m));
    c1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w[1]), sh), m));
}

template <>
inline void codes16<8>(const uint8_t* row, int i0, __m256& c0, __m256& c1)
{
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i0));
    c0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    c1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
}

// Whether any of x[0..n) (n % 8 == 0) is below zero (NaN is not).
inline bool any_negative(const float* x, int n)
{
    __m256 neg = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) neg = _mm256_or_ps(neg, _mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_movemask_ps(neg) != 0;
}

// ---- Hadamard ----------------------------------------------------------------------
// Stages h = 1, 2, 4 inside a vector: y = x with partners swapped; lanes whose
// index has bit h clear take x + y (= a + b), the others y - x (= a - b), the
// same two operands the scalar butterfly adds/subtracts, so results are identical.
// One butterfly stage inside a vector: x + y where the sign is +1, y - x where it
// is -1 (y = x's partner lane), as x * sign + y in one exact-rounding FMA:
// bit-identical to the add/sub/blend it replaces, in two ops instead of four.
inline __m256 butterfly(__m256 x, __m256 y, __m256 sign) { return _mm256_fmadd_ps(x, sign, y); }

inline __m256 fwht8(__m256 x)
{
    x = butterfly(x, _mm256_permute_ps(x, 0xB1), _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1));  // 1 0 3 2
    x = butterfly(x, _mm256_permute_ps(x, 0x4E), _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1));  // 2 3 0 1
    return butterfly(x, _mm256_permute2f128_ps(x, x, 0x01), _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1));
}

// The cross-vector butterflies of distance H, 2H, ... < NV: one template level per stage, so
// every loop has constant bounds and unrolls (with one loop over h <<= 1, GCC 12 kept v[] on
// the stack: 8 spills and reloads per row).
template <int NV, int H>
inline void cross_stages(__m256 (&v)[NV])
{
    if constexpr (H < NV) {
        for (int i = 0; i < NV; i += 2 * H)
            for (int j = i; j < i + H; ++j) {
                const __m256 a = v[j], c = v[j + H];
                v[j] = _mm256_add_ps(a, c);                                // adder pipes
                v[j + H] = _mm256_fnmadd_ps(c, _mm256_set1_ps(1.0f), a);  // a - c, exactly, on the FMA pipes
            }
        cross_stages<NV, 2 * H>(v);
    }
}

// The vector width convert_simd.inc is written for.
using SimdVec = __m256;
constexpr int kSimdLanes = 8;
inline SimdVec simd_load_f32(const float* p) { return _mm256_loadu_ps(p); }
inline SimdVec simd_load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline SimdVec simd_round_to_f16(SimdVec x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }
inline SimdVec simd_mul(SimdVec a, SimdVec b) { return _mm256_mul_ps(a, b); }
inline SimdVec simd_fwht_lanes(SimdVec x) { return fwht8(x); }  // the butterflies within a vector
inline void simd_store(float* p, SimdVec x) { _mm256_storeu_ps(p, x); }

#include "convert_simd.inc"

// dst = Hadamard of src (rows in input_type's format, KVARN_INPUT_*), row by row (dst may equal src).
void hadamard_rows_avx2(const void* src, int input_type, float* dst, int64_t rows, int head_dim)
{
    const int block = kvarn_hadamard_block(head_dim);  // >= 16: head_dim % 16 == 0
    const __m256 norm = _mm256_set1_ps((float)(1.0 / sqrt((double)block)));
    switch (block / 8) {  // up to 16 vectors: the 16 ymm registers (the loads stream, so few spill)
        case 2: return hadamard_rows_in_registers<2>(src, input_type, dst, rows, head_dim, norm);
        case 4: return hadamard_rows_in_registers<4>(src, input_type, dst, rows, head_dim, norm);
        case 8: return hadamard_rows_in_registers<8>(src, input_type, dst, rows, head_dim, norm);
        default: break;
    }
    // Blocks of 128 and more: the input as float32 in dst, then the transform in place there.
    to_float_simd(src, input_type, dst, rows * head_dim);
    for (int64_t r = 0; r < rows; ++r) {
        float* row = dst + r * head_dim;
        for (int b = 0; b < head_dim; b += block) {
            float* p = row + b;
            for (int i = 0; i < block; i += 8) _mm256_storeu_ps(p + i, fwht8(_mm256_loadu_ps(p + i)));
            for (int h = 8; h < block; h <<= 1)
                for (int i = 0; i < block; i += 2 * h)
                    for (int j = i; j < i + h; j += 8) {
                        const __m256 a = _mm256_loadu_ps(p + j), c = _mm256_loadu_ps(p + j + h);
                        _mm256_storeu_ps(p + j, _mm256_add_ps(a, c));
                        _mm256_storeu_ps(p + j + h, _mm256_sub_ps(a, c));
                    }
        }
        for (int d = 0; d < head_dim; d += 8) _mm256_storeu_ps(row + d, _mm256_mul_ps(_mm256_loadu_ps(row + d), norm));
    }
}

void hadamard_f32_avx2(float* x, int64_t rows, int head_dim) { hadamard_rows_avx2(x, KVARN_INPUT_F32, x, rows, head_dim); }

// ---- attention over quantised tiles ------------------------------------------------------
// s[h][t] = sum_d qa[h][d] * code[d][t] for NH heads at once: the codes of a
// 16-token block are unpacked once per channel and used by every head.
template <int KB, int NH>
void tile_scores(const uint8_t* kc, int D, int G, const float* qa, float* s, Prefetcher& pf)
{
    const size_t row_bytes = (size_t)G * KB / 8;
    for (int t0 = 0; t0 < G; t0 += 16) {
        __m256 a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) a0[h] = a1[h] = _mm256_setzero_ps();
        const uint8_t* p = kc;
        for (int d = 0; d < D; ++d, p += row_bytes) {
            if ((d & 3) == 0) pf.step();
            __m256 c0, c1;
            codes16<KB>(p, t0, c0, c1);
            for (int h = 0; h < NH; ++h) {
                const __m256 qb = _mm256_broadcast_ss(qa + h * D + d);
                a0[h] = _mm256_fmadd_ps(qb, c0, a0[h]);
                a1[h] = _mm256_fmadd_ps(qb, c1, a1[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            _mm256_store_ps(s + h * G + t0, a0[h]);
            _mm256_store_ps(s + h * G + t0 + 8, a1[h]);
        }
    }
}

// tmp[h][d] = sum_t w[h][t] * code[t][d], 16 channels at a time.
template <int VB, int NH>
void tile_values(const uint8_t* vcodes, int D, int G, const float* w, float* tmp, Prefetcher& pf)
{
    const size_t row_bytes = (size_t)D * VB / 8;
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256 a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) a0[h] = a1[h] = _mm256_setzero_ps();
        const uint8_t* p = vcodes;
        for (int t = 0; t < G; ++t, p += row_bytes) {
            if ((t & 3) == 0) pf.step();
            __m256 c0, c1;
            codes16<VB>(p, d0, c0, c1);
            for (int h = 0; h < NH; ++h) {
                const __m256 wb = _mm256_broadcast_ss(w + h * G + t);
                a0[h] = _mm256_fmadd_ps(wb, c0, a0[h]);
                a1[h] = _mm256_fmadd_ps(wb, c1, a1[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            _mm256_store_ps(tmp + h * D + d0, a0[h]);
            _mm256_store_ps(tmp + h * D + d0 + 8, a1[h]);
        }
    }
}

template <int KB>
void scores_dispatch(int nh, const uint8_t* kc, int D, int G, const float* qa, float* s, Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_scores<KB, decltype(heads)::value>(kc, D, G, qa, s, pf);
    });
}

template <int VB>
void values_dispatch(int nh, const uint8_t* vcodes, int D, int G, const float* w, float* tmp, Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_values<VB, decltype(heads)::value>(vcodes, D, G, w, tmp, pf);
    });
}

constexpr int kHeadGroup = 4;  // query heads sharing one pass over a tile's codes

// The int8 score mode scores centred codes c - 7.5, as the avx512 file (its kCentreCode says why).
constexpr float kCentreCode = 7.5f;

// kzc = kz + 7.5 ka (one rounding), as the avx512 file; n % 8 == 0.
inline void centred_zero_points(const float* ka, const float* kz, float* kzc, int n)
{
    const __m256 c0 = _mm256_set1_ps(kCentreCode);
    for (int i = 0; i < n; i += 8)
        _mm256_store_ps(kzc + i, _mm256_fmadd_ps(_mm256_load_ps(ka + i), c0, _mm256_load_ps(kz + i)));
}

// ---- int16 mode (the avx512 file's arithmetic without VNNI) ------------------------------
// acc + the int32 sums of int16 pairs a*b: vpmaddwd + vpaddd, exactly what vpdpwssd
// computes (no pair here can reach the one overflowing case, -32768 * -32768 twice).
// The add is asm with the accumulator tied to its output: with the intrinsic GCC 12
// added into a fresh register and copied it back (a vmovdqa per product, one
// accumulator spilled at 4 heads), as it did with the avx512 file's dpwssd.
// kVnni: CPUs with AVX-VNNI (Alder Lake and later, Sapphire Rapids, Zen 5) do both in
// one VEX-encoded vpdpwssd, the same int32 result. It is asm, not an intrinsic, so this
// file needs no -mavxvnni and the compiler never emits it elsewhere; the instantiation
// that runs it is chosen at run time (avx_vnni_on(), from cpuid).
template <bool kVnni>
inline __m256i dp16(__m256i acc, __m256i a, __m256i b)
{
    if constexpr (kVnni) {
        asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    } else {
        const __m256i prod = _mm256_madd_epi16(a, b);
        asm("vpaddd %1, %0, %0" : "+x"(acc) : "x"(prod));
    }
    return acc;
}

// What the int16 score kernel needs to finish a tile's scores (as in the avx512 file).
struct ScoreArgs {
    const float* qscale;
    const float* qz;
    const float* kt;
    int G;
    float* s;  // [NH][G]
};

// Finishes 16 tokens' int32 sums of head h (ev: tokens t0, t0+2, ..., od: t0+1, t0+3, ...)
// in token order as s = kt * (sum * qscale + qz); smax keeps the running maximum.
inline void finish_int_scores(__m256i ev, __m256i od, const ScoreArgs& a, int h, int t0, __m256& smax)
{
    const __m256 sc = _mm256_set1_ps(a.qscale[h]), z = _mm256_set1_ps(a.qz[h]);
    const __m256 fe = _mm256_mul_ps(_mm256_cvtepi32_ps(ev), sc), fo = _mm256_mul_ps(_mm256_cvtepi32_ps(od), sc);
    const __m256 lo = _mm256_unpacklo_ps(fe, fo), hi = _mm256_unpackhi_ps(fe, fo);  // tokens 0-3 | 8-11, 4-7 | 12-15
    const __m256 v[2] = {_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31)};
    for (int i = 0; i < 2; ++i) {
        const int t = t0 + 8 * i;
        const __m256 sv = _mm256_mul_ps(_mm256_load_ps(a.kt + t), _mm256_add_ps(v[i], z));
        _mm256_store_ps(a.s + h * a.G + t, sv);
        smax = _mm256_max_ps(smax, sv);
    }
}

// The 8 bytes at a and the 8 at b interleaved (a's byte i, then b's), in an xmm.
inline __m128i interleaved_rows(const uint8_t* a, const uint8_t* b)
{
    return _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                             _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
}

// Each 128-bit lane: the 8 bytes at a, then the 8 at b (two 64-bit broadcast loads and a blend), so that
// in-lane vpshufb can place any byte of either row in either lane.
inline __m256i rows_side_by_side(const uint8_t* a, const uint8_t* b)
{
    int64_t x0, x1;
    memcpy(&x0, a, 8);
    memcpy(&x1, b, 8);
    return _mm256_blend_epi32(_mm256_set1_epi64x(x0), _mm256_set1_epi64x(x1), 0xCC);
}

// Word 2i of the result = byte i of row r, word 2i + 1 = byte i of row r + stride,
// for i = 0..7: the 8 bytes of two rows interleaved and widened. Two forms, the same
// words. Without AVX-VNNI (Zen 1-3, Intel before Alder Lake) rows_side_by_side and one
// in-lane vpshufb: Zen 3 runs vpmovzxbw to ymm, lane-crossing, at 0.8 a cycle, and this
// form took 0.95 of the time per record there. With AVX-VNNI (Intel's Golden Cove and
// later) vpunpcklbw + vpmovzxbw: on the lent Sapphire Rapids the broadcast form took
// 1.02-1.10 of the time at head_dim 64 (RESULTS section 2, thirty-seventh session).
template <bool kVnni>
inline __m256i row_pair_words(const uint8_t* r, size_t stride)
{
    if constexpr (kVnni) return _mm256_cvtepu8_epi16(interleaved_rows(r, r + stride));
    // bytes 0-3 of both rows go to the low lane, 4-7 to the high
    const __m256i widen = _mm256_setr_epi8(0, -1, 8, -1, 1, -1, 9, -1, 2, -1, 10, -1, 3, -1, 11, -1,
                                           4, -1, 12, -1, 5, -1, 13, -1, 6, -1, 14, -1, 7, -1, 15, -1);
    return _mm256_shuffle_epi8(rows_side_by_side(r, r + stride), widen);
}

// Int16 scores for 4-bit keys, 16 tokens per pass: the 8 bytes of rows d and d+1
// interleaved and widened to words (row_pair_words) give, per dword, one even token's
// two codes in the low nibbles and the next odd token's in the high ones, so an and
// and a shift make the even and the odd tokens' (code_d, code_d+1) pairs for vpmaddwd
// with the int16 query pair (q16[d], q16[d+1]). Sums exact in int32 (D <= 1024, as avx512);
// s = kt (sum qscale + qz) per element as there, so the scores are the same floats.
template <int NH, bool kVnni>
void tile_scores_k4_int16(const uint8_t* kc, int D, const int16_t* qi, const ScoreArgs& a, __m256* smax, Prefetcher& pf)
{
    const int G = a.G;
    const size_t row_bytes = (size_t)G / 2;
    const __m256i nib = _mm256_set1_epi16(0x0F);
    for (int t0 = 0; t0 < G; t0 += 16) {
        __m256i ev[NH], od[NH];
        for (int h = 0; h < NH; ++h) ev[h] = od[h] = _mm256_setzero_si256();
        const uint8_t* p = kc + t0 / 2;
        for (int d = 0; d < D; d += 2, p += 2 * row_bytes) {
            if ((d & 7) == 0) pf.step();
            const __m256i y = row_pair_words<kVnni>(p, row_bytes);
            const __m256i we = _mm256_and_si256(y, nib), wo = _mm256_srli_epi16(y, 4);
            for (int h = 0; h < NH; ++h) {
                int32_t q2;
                memcpy(&q2, qi + h * D + d, 4);
                const __m256i qb = _mm256_set1_epi32(q2);
                ev[h] = dp16<kVnni>(ev[h], we, qb);
                od[h] = dp16<kVnni>(od[h], wo, qb);
            }
        }
        for (int h = 0; h < NH; ++h) finish_int_scores(ev[h], od[h], a, h, t0, smax[h]);
    }
}

// acc + the int32 sums of 4 unsigned-byte x signed-byte products per dword: vpdpbusd
// (AVX-VNNI), asm for the reason dp16 gives. Only the kVnni instantiation calls it.
inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8)
{
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u8), "x"(s8));
    return acc;
}

// Dword j (lane 0: j = 0-3, lane 1: 4-7) = byte j of each of four rows r, r + stride,
// r + 2 stride, r + 3 stride: a 4 x 8 byte transpose. Two forms as in row_pair_words,
// for the same reason. Without AVX-VNNI rows 0 and 1 (and 2 and 3) side by side and one
// in-lane vpshufb per pair (Zen 3 runs vinserti128 and vpermd, lane-crossing, at 1 a
// cycle). With it, the rows' bytes interleaved in two xmm and the halves joined.
template <bool kVnni>
inline __m256i row_quads(const uint8_t* r, size_t stride)
{
    if constexpr (kVnni) {
        const __m128i r01 = interleaved_rows(r, r + stride), r23 = interleaved_rows(r + 2 * stride, r + 3 * stride);
        return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(r01, r23)), _mm_unpackhi_epi16(r01, r23), 1);
    }
    const __m256i pick01 = _mm256_setr_epi8(0, 8, -1, -1, 1, 9, -1, -1, 2, 10, -1, -1, 3, 11, -1, -1,
                                            4, 12, -1, -1, 5, 13, -1, -1, 6, 14, -1, -1, 7, 15, -1, -1);
    const __m256i pick23 = _mm256_setr_epi8(-1, -1, 0, 8, -1, -1, 1, 9, -1, -1, 2, 10, -1, -1, 3, 11,
                                            -1, -1, 4, 12, -1, -1, 5, 13, -1, -1, 6, 14, -1, -1, 7, 15);
    return _mm256_or_si256(_mm256_shuffle_epi8(rows_side_by_side(r, r + stride), pick01),
                           _mm256_shuffle_epi8(rows_side_by_side(r + 2 * stride, r + 3 * stride), pick23));
}

// acc + the int16 sums of 2 unsigned-byte x signed-byte products per word (vpmaddubsw +
// vpaddw; no sum here comes near saturating), the add tied to acc as in dp16.
inline __m256i maddubs_add(__m256i acc, __m256i u8, __m256i s8)
{
    const __m256i prod = _mm256_maddubs_epi16(u8, s8);
    asm("vpaddw %1, %0, %0" : "+x"(acc) : "x"(prod));
    return acc;
}

// Int8 scores for 4-bit keys, 16 tokens x 4 channels per step: the 8 bytes of rows
// d..d+3 transposed (row_quads) give per dword one byte of each row, i.e. token 2j's 4 codes in
// the low nibbles and token 2j+1's in the high ones (the avx512 int8 kernel's dwords);
// vpmaddubsw multiplies them by the int8 query quad (q8[d..d+3]) into two int16 sums
// per token. Each is at most 2 * 15 * 127 = 3810 in magnitude, so 8 steps (32
// channels) add up in int16 without overflow before vpmaddwd by ones widens them to
// int32: the same exact sums as avx512's vpdpbusd, so the same float scores. With
// AVX-VNNI, vpdpbusd does it all in int32. Half the multiply instructions of the
// int16 kernel per code, for the int8 query's coarser rounding (docs/simd.md).
template <int NH, bool kVnni>
void tile_scores_k4_int8(const uint8_t* kc, int D, const int8_t* qi, const ScoreArgs& a, __m256* smax, Prefetcher& pf)
{
    const int G = a.G;
    const size_t row_bytes = (size_t)G / 2;
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    constexpr int kStepsPerWiden = 8;  // 8 * 3810 <= 32767
    for (int t0 = 0; t0 < G; t0 += 16) {
        // int32 sums of the even and odd tokens (dword j: token t0 + 2j / t0 + 2j + 1); in
        // memory, not registers: with the int16 sums of 4 heads they would not fit in 16
        alignas(32) int32_t acc[NH][2][8] = {};
        const uint8_t* p = kc + t0 / 2;
        for (int d0 = 0; d0 < D; d0 += 4 * kStepsPerWiden) {
            const int d1 = d0 + 4 * kStepsPerWiden < D ? d0 + 4 * kStepsPerWiden : D;
            __m256i ev[NH], od[NH];
            for (int h = 0; h < NH; ++h) {
                ev[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc[h][0]));
                od[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc[h][1]));
            }
            __m256i ev16[NH], od16[NH];
            for (int h = 0; h < NH; ++h) ev16[h] = od16[h] = _mm256_setzero_si256();
            for (int d = d0; d < d1; d += 4, p += 4 * row_bytes) {
                if ((d & 7) == 0) pf.step();
                const __m256i y = row_quads<kVnni>(p, row_bytes);
                const __m256i ce = _mm256_and_si256(y, nib), co = _mm256_and_si256(_mm256_srli_epi16(y, 4), nib);
                for (int h = 0; h < NH; ++h) {
                    int32_t q4;
                    memcpy(&q4, qi + h * D + d, 4);
                    const __m256i qb = _mm256_set1_epi32(q4);
                    if constexpr (kVnni) {
                        ev[h] = dpbusd(ev[h], ce, qb);
                        od[h] = dpbusd(od[h], co, qb);
                    } else {
                        ev16[h] = maddubs_add(ev16[h], ce, qb);
                        od16[h] = maddubs_add(od16[h], co, qb);
                    }
                }
            }
            for (int h = 0; h < NH; ++h) {
                if constexpr (!kVnni) {
                    ev[h] = _mm256_add_epi32(ev[h], _mm256_madd_epi16(ev16[h], ones));
                    od[h] = _mm256_add_epi32(od[h], _mm256_madd_epi16(od16[h], ones));
                }
                _mm256_store_si256(reinterpret_cast<__m256i*>(acc[h][0]), ev[h]);
                _mm256_store_si256(reinterpret_cast<__m256i*>(acc[h][1]), od[h]);
            }
        }
        for (int h = 0; h < NH; ++h)
            finish_int_scores(_mm256_load_si256(reinterpret_cast<const __m256i*>(acc[h][0])),
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(acc[h][1])), a, h, t0, smax[h]);
    }
}

// The value sums' float form from the exact int32 sums S = sum_t wi c: y = 2 S - 3 W is
// sum_t wi (2c - 3) (w3 = 3 W), and sum_t w c = (wscale y + 3 wsum) / 2 = y sc + off.
inline __m256 centred_value_sums(__m256i S, __m256i w3, __m256 sc, __m256 off)
{
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_slli_epi32(S, 1), w3)), sc, off);
}

// Int16 value sums for 2-bit values, 16 channels x 2 tokens per step (the avx512
// file's scheme: w = p va rounded to int16, centred codes, exact int32 sums). Bytes j
// of rows t and t+1 (channels 4j..4j+3) each broadcast to every dword and their words
// interleaved give dwords (row t's word, row t+1's word) whose low bytes hold quad 0 or
// 2 (quads 1 and 3 from the same loads one byte on); a per-dword mask then keeps code
// k of both tokens at bit 2k of each word, i.e. (code_t, code_t+1) * 4^k, so one vpand
// and no shift or widening per register makes 8 channels' pairs. Zen 3 runs the
// widening and lane-crossing shuffles this replaced at 1 a cycle or less. The scaled
// sums stay exact (at most 64 * 3 * 32767 * 128 < 2^31) and an arithmetic shift by 2k
// recovers each channel's sum exactly, so the output is the same floats.
template <int NH, bool kVnni>
void tile_values_v2_int16(const uint8_t* vcodes, int D, int G, const int16_t* w16, const int32_t* w16_sum,
                          const float* wscale, const float* wsum, float* tmp, Prefetcher& pf)
{
    const size_t row_bytes = (size_t)D / 4;
    // dwords 0-7 hold quads 0 2 0 2 | 0 2 0 2 (the +1 loads: 1 3 1 3 | 1 3 1 3); keep code k = 0 0 1 1 | 2 2 3 3
    const __m256i keep = _mm256_setr_epi32(0x00030003, 0x00030003, 0x000C000C, 0x000C000C, 0x00300030, 0x00300030,
                                           0x00C000C0, 0x00C000C0);
    const __m256i unscale = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256i a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) a0[h] = a1[h] = _mm256_setzero_si256();
        const uint8_t* p = vcodes + d0 / 4;
        for (int t = 0; t < G; t += 2, p += 2 * row_bytes) {
            if ((t & 7) == 0) pf.step();
            // The +1 loads read one byte past this chunk: the next chunk's, the next row's, or for the
            // tile's last row the record's vc vector, which follows the value codes (SPEC section 6).
            int32_t r0, r1, r0n, r1n;
            memcpy(&r0, p, 4);
            memcpy(&r1, p + row_bytes, 4);
            memcpy(&r0n, p + 1, 4);
            memcpy(&r1n, p + row_bytes + 1, 4);
            const __m256i x0 = _mm256_and_si256(_mm256_unpacklo_epi16(_mm256_set1_epi32(r0), _mm256_set1_epi32(r1)), keep);
            const __m256i x1 = _mm256_and_si256(_mm256_unpacklo_epi16(_mm256_set1_epi32(r0n), _mm256_set1_epi32(r1n)), keep);
            for (int h = 0; h < NH; ++h) {
                int32_t wp;
                memcpy(&wp, w16 + h * G + t, 4);
                const __m256i wb = _mm256_set1_epi32(wp);
                a0[h] = dp16<kVnni>(a0[h], x0, wb);
                a1[h] = dp16<kVnni>(a1[h], x1, wb);
            }
        }
        for (int h = 0; h < NH; ++h) {
            const __m256 sc = _mm256_set1_ps(0.5f * wscale[h]), off = _mm256_set1_ps(1.5f * wsum[h]);
            // unsigned: wraps instead of overflowing where a NaN weight (a corrupt record) made w16_sum garbage
            const __m256i w3 = _mm256_set1_epi32((int32_t)(3u * (uint32_t)w16_sum[h]));
            const __m256 f0 = centred_value_sums(_mm256_srav_epi32(a0[h], unscale), w3, sc, off);
            const __m256 f1 = centred_value_sums(_mm256_srav_epi32(a1[h], unscale), w3, sc, off);
            // f0 = channels 0 8 1 9 | 2 10 3 11, f1 = 4 12 5 13 | 6 14 7 15
            const __m256 lo = _mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(2, 0, 2, 0));  // 0 1 4 5 | 2 3 6 7
            const __m256 hi = _mm256_shuffle_ps(f0, f1, _MM_SHUFFLE(3, 1, 3, 1));  // 8 9 12 13 | 10 11 14 15
            _mm256_store_ps(tmp + h * D + d0, _mm256_permutevar8x32_ps(lo, order));
            _mm256_store_ps(tmp + h * D + d0 + 8, _mm256_permutevar8x32_ps(hi, order));
        }
    }
}

// The int8 mode's value sums for 2-bit values (the avx512 file's scheme): w = p va
// rounded to uint8, centred codes, exact int32 sums. Per step 4 tokens x 32 channels:
// row_quads transposes the rows' 8 bytes, so dword b (lane 0: b = 0-3, lane 1: 4-7)
// holds byte b (channels 4b..4b+3) of the four tokens; shift 2k + mask give
// channel 4b+k, multiplied by the weight quad with vpdpbusd (AVX-VNNI) or vpmaddubsw:
// int16 pair sums <= 2 * 255 * 3 = 1530, so 16 steps add up in int16 (<= 24480) before
// vpmaddwd by ones widens them, the same exact sums. C: 16-channel halves in the chunk
// (1 for D % 32's tail: 4 bytes per row, the upper lane zero, no byte past the row read).
// One pass over the tokens makes channels 4b+k for k = K0..K0+KP-1 into acc[h][k].
// kQuads: kSave keeps each step's transposed quads in quads_buf (G/4 registers), kReuse
// reads them back instead of loading and transposing the rows again (the second pass).
enum QuadSource { kTranspose, kSave, kReuse };
template <int NH, bool kVnni, int C, int K0, int KP, QuadSource kQuads = kTranspose>
inline void values_pass_v2_int8(const uint8_t* p, size_t row_bytes, int G, const uint8_t* w8,
                                int32_t (*acc)[4][8], Prefetcher& pf, __m256i* quads_buf = nullptr)
{
    constexpr int kStepsPerWiden = 16;  // 16 * 1530 <= 32767
    const __m256i transpose = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m256i m = _mm256_set1_epi32(0x03030303), ones = _mm256_set1_epi16(1);
    __m256i a[NH][KP];  // int32 sums (VNNI), int16 ones (madd: the int32 ones wait in acc)
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < KP; ++k) {
            a[h][k] = _mm256_setzero_si256();
            if constexpr (!kVnni) _mm256_store_si256(reinterpret_cast<__m256i*>(acc[h][K0 + k]), a[h][k]);
        }
    for (int t0 = 0; t0 < G; t0 += 4 * kStepsPerWiden) {
        const int t1 = t0 + 4 * kStepsPerWiden < G ? t0 + 4 * kStepsPerWiden : G;
        for (int t = t0; t < t1; t += 4, p += 4 * row_bytes) {
            pf.step();
            __m256i quads;
            if constexpr (kQuads == kReuse) {
                quads = _mm256_load_si256(quads_buf + t / 4);
            } else if constexpr (C == 2) {
                quads = row_quads<kVnni>(p, row_bytes);
            } else {
                int32_t r[4];
                for (int i = 0; i < 4; ++i) memcpy(r + i, p + i * row_bytes, 4);
                const __m128i rows = _mm_setr_epi32(r[0], r[1], r[2], r[3]);
                quads = _mm256_inserti128_si256(_mm256_setzero_si256(),
                                                _mm_shuffle_epi8(rows, _mm256_castsi256_si128(transpose)), 0);
            }
            if constexpr (kQuads == kSave) _mm256_store_si256(quads_buf + t / 4, quads);
            __m256i x[KP];
            for (int k = 0; k < KP; ++k) x[k] = _mm256_and_si256(_mm256_srli_epi32(quads, 2 * (K0 + k)), m);
            for (int h = 0; h < NH; ++h) {
                int32_t wq;
                memcpy(&wq, w8 + h * G + t, 4);
                const __m256i wb = _mm256_set1_epi32(wq);
                for (int k = 0; k < KP; ++k) {
                    if constexpr (kVnni)
                        a[h][k] = dpbusd(a[h][k], wb, x[k]);
                    else
                        a[h][k] = maddubs_add(a[h][k], wb, x[k]);
                }
            }
        }
        if constexpr (!kVnni)
            for (int h = 0; h < NH; ++h)
                for (int k = 0; k < KP; ++k) {
                    __m256i* q = reinterpret_cast<__m256i*>(acc[h][K0 + k]);
                    _mm256_store_si256(q, _mm256_add_epi32(_mm256_load_si256(q), _mm256_madd_epi16(a[h][k], ones)));
                    a[h][k] = _mm256_setzero_si256();
                }
    }
    if constexpr (kVnni)
        for (int h = 0; h < NH; ++h)
            for (int k = 0; k < KP; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(acc[h][K0 + k]), a[h][k]);
}

template <int NH, bool kVnni, int C>
inline void values_chunk_v2_int8(const uint8_t* vcodes, size_t row_bytes, int D, int G, int d0, const uint8_t* w8,
                                 const int32_t* w8_sum, const float* wscale, const float* wsum, float* tmp,
                                 Prefetcher& pf)
{
    alignas(32) int32_t acc[NH][4][8];
    const uint8_t* p = vcodes + d0 / 4;
    if constexpr (NH <= 2) {
        values_pass_v2_int8<NH, kVnni, C, 0, 4>(p, row_bytes, G, w8, acc, pf);
    } else {  // the sums of all 4 k for 3 or 4 heads (and the madd form's int16 ones) would not fit 16 registers
        alignas(32) __m256i quads[128 / 4];  // G <= 128: the first pass's transposed rows, for the second
        values_pass_v2_int8<NH, kVnni, C, 0, 2, kSave>(p, row_bytes, G, w8, acc, pf, quads);
        values_pass_v2_int8<NH, kVnni, C, 2, 2, kReuse>(p, row_bytes, G, w8, acc, pf, quads);
    }
    for (int h = 0; h < NH; ++h) {
        const __m256 sc = _mm256_set1_ps(0.5f * wscale[h]), off = _mm256_set1_ps(1.5f * wsum[h]);
        const __m256i w3 = _mm256_set1_epi32((int32_t)(3u * (uint32_t)w8_sum[h]));  // unsigned: as in the int16 kernel
        __m256 y[4];
        for (int k = 0; k < 4; ++k)  // y[k] lane L, dword b: channel 16L + 4b + k
            y[k] = centred_value_sums(_mm256_load_si256(reinterpret_cast<const __m256i*>(acc[h][k])), w3, sc, off);
        // 4x4 transpose in each lane (z[j] lane L: channels 16L + 4j .. 4j+3), then the lanes in order
        const __m256 t0 = _mm256_unpacklo_ps(y[0], y[1]), t1 = _mm256_unpackhi_ps(y[0], y[1]);
        const __m256 t2 = _mm256_unpacklo_ps(y[2], y[3]), t3 = _mm256_unpackhi_ps(y[2], y[3]);
        const __m256 z0 = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
        const __m256 z1 = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
        const __m256 z2 = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
        const __m256 z3 = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
        float* o = tmp + h * D + d0;
        _mm256_store_ps(o, _mm256_permute2f128_ps(z0, z1, 0x20));
        _mm256_store_ps(o + 8, _mm256_permute2f128_ps(z2, z3, 0x20));
        if constexpr (C == 2) {
            _mm256_store_ps(o + 16, _mm256_permute2f128_ps(z0, z1, 0x31));
            _mm256_store_ps(o + 24, _mm256_permute2f128_ps(z2, z3, 0x31));
        }
    }
}

template <int NH, bool kVnni>
void tile_values_v2_int8(const uint8_t* vcodes, int D, int G, const uint8_t* w8, const int32_t* w8_sum,
                         const float* wscale, const float* wsum, float* tmp, Prefetcher& pf)
{
    const size_t row_bytes = (size_t)D / 4;
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32)
        values_chunk_v2_int8<NH, kVnni, 2>(vcodes, row_bytes, D, G, d0, w8, w8_sum, wscale, wsum, tmp, pf);
    if (d0 < D) values_chunk_v2_int8<NH, kVnni, 1>(vcodes, row_bytes, D, G, d0, w8, w8_sum, wscale, wsum, tmp, pf);
}

template <bool kVnni>
void scores_int16_dispatch(int nh, const uint8_t* kc, int D, const int16_t* qi, const ScoreArgs& a, __m256* smax,
                           Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_scores_k4_int16<decltype(heads)::value, kVnni>(kc, D, qi, a, smax, pf);
    });
}

template <bool kVnni>
void scores_int8_dispatch(int nh, const uint8_t* kc, int D, const int8_t* qi, const ScoreArgs& a, __m256* smax,
                          Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_scores_k4_int8<decltype(heads)::value, kVnni>(kc, D, qi, a, smax, pf);
    });
}

template <bool kVnni>
void values_v2_int16_dispatch(int nh, const uint8_t* vcodes, int D, int G, const int16_t* w16, const int32_t* w16_sum,
                              const float* wscale, const float* wsum, float* tmp, Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_values_v2_int16<decltype(heads)::value, kVnni>(vcodes, D, G, w16, w16_sum, wscale, wsum, tmp, pf);
    });
}

template <bool kVnni>
void values_v2_int8_dispatch(int nh, const uint8_t* vcodes, int D, int G, const uint8_t* w8, const int32_t* w8_sum,
                             const float* wscale, const float* wsum, float* tmp, Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_values_v2_int8<decltype(heads)::value, kVnni>(vcodes, D, G, w8, w8_sum, wscale, wsum, tmp, pf);
    });
}

// Online-softmax bookkeeping for a block whose largest score is block_max: when it
// raises the running max m, l and both accumulators are rescaled by exp(m_old - m_new).
inline void softmax_rescale(float block_max, float* m, float* l, float* acc_orig, float* acc_rot, int D)
{
    if (!(block_max > *m)) return;
    const float alpha = expf(*m - block_max);
    *m = block_max;
    if (alpha == 1.0f) return;
    *l *= alpha;
    const __m256 av = _mm256_set1_ps(alpha);
    for (int d = 0; d < D; d += 8) {
        _mm256_storeu_ps(acc_orig + d, _mm256_mul_ps(_mm256_loadu_ps(acc_orig + d), av));
        _mm256_storeu_ps(acc_rot + d, _mm256_mul_ps(_mm256_loadu_ps(acc_rot + d), av));
    }
}

// Online-softmax step for one head over n scores (n % 8 == 0): rescales l and
// both accumulators when the max grows, leaves p = exp(s - m) in s, returns nothing.
inline void softmax_update(float* s, int n, float* m, float* l, float* acc_orig, float* acc_rot, int D)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int t = 0; t < n; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + t));
    softmax_rescale(hmax(mx), m, l, acc_orig, acc_rot, D);
    const __m256 mv = _mm256_set1_ps(*m);
    __m256 sum = _mm256_setzero_ps();
    for (int t = 0; t < n; t += 8) {
        const __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
        _mm256_storeu_ps(s + t, p);
        sum = _mm256_add_ps(sum, p);
    }
    *l += hsum(sum);
}

// The int16 mode's per-head work on one tile: p = exp(s - m) with the cheaper exp, l,
// pz = sum p vz, the weights w = p va and, for 2-bit values, w rounded against its max
// (wscale) to int16 (w16h) or, in the int8 mode, uint8 (w8h), their exact int sum and
// the float sum, as the avx512 file does.
template <bool kIntWeights>
inline void int_mode_weights(float* sh, const float* va, const float* vz, float m, int G, float* l, float* pz,
                             int16_t* w16h, uint8_t* w8h, float* wscale, float* wsum, int32_t* w_isum, bool va_negative)
{
    const __m256 mv = _mm256_set1_ps(m);
    __m256 psum = _mm256_setzero_ps(), z = psum, wmx = psum, wsm = psum;
    for (int t = 0; t < G; t += 8) {
        const __m256 p = exp_int_mode_ps(_mm256_sub_ps(_mm256_load_ps(sh + t), mv));
        psum = _mm256_add_ps(psum, p);
        z = _mm256_fmadd_ps(p, _mm256_load_ps(vz + t), z);
        const __m256 w = _mm256_mul_ps(p, _mm256_load_ps(va + t));
        _mm256_store_ps(sh + t, w);
        if (kIntWeights) {
            wmx = _mm256_max_ps(wmx, w);
            wsm = _mm256_add_ps(wsm, w);
        }
    }
    *l += hsum(psum);
    *pz = hsum(z);
    if (!kIntWeights) return;
    *wsum = hsum(wsm);
    const float wmax = hmax(wmx), top = w8h ? 255.0f : 32767.0f;
    *wscale = va_negative ? NAN : wmax > 0.0f ? wmax / top : 0.0f;
    const __m256 inv = _mm256_set1_ps(inverse_scale(top, wmax));
    const __m256i itop = _mm256_set1_epi32((int32_t)top);
    __m256i isum = _mm256_setzero_si256();
    for (int t = 0; t < G; t += 16) {
        // min: a product rounded past the top saturates, and the sum must be of what is stored
        const __m256i r0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(sh + t), inv)), itop);
        const __m256i r1 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(sh + t + 8), inv)), itop);
        isum = _mm256_add_epi32(isum, _mm256_add_epi32(r0, r1));
        // packs works per 128-bit lane: words 0-3 r0, 4-7 r1, 8-11 r0, 12-15 r1 -> reorder the qwords
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(r0, r1), 0xD8);
        if (w8h)  // packus stores what avx512's vpmovdb does: 0..255 as is, a NaN's INT_MIN as 0
            _mm_store_si128(reinterpret_cast<__m128i*>(w8h + t),
                            _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
        else
            _mm256_store_si256(reinterpret_cast<__m256i*>(w16h + t), w);
    }
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    *w_isum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}

template <int KB, int VB>
void attend_tiles_impl(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record,
                       int64_t n_tiles, int64_t tile_stride, SoftmaxState st)
{
    const int G = fmt.group, D = fmt.head_dim;
    const kvarn_record_layout L = record_layout(fmt);
    // int16 mode: 4-bit key scores and 2-bit value sums in integers (other widths stay float)
    const int mode = score_mode();
    const bool int_on = mode != kScoresFloat;
    const bool int_scores = KB == 4 && int_on, int_values = VB == 2 && int_on, int_mode = int_scores || int_values;
    const bool int8_scores = int_scores && mode == kScoresInt8;  // the query in int8
    const bool byte_values = int_values && mode == kScoresInt8;  // and the value weights in uint8
    const bool vnni = int_mode && avx_vnni_on();
    alignas(32) float ka[KVARN_MAX_HEAD_DIM], kz[KVARN_MAX_HEAD_DIM], kzc[KVARN_MAX_HEAD_DIM], vc[KVARN_MAX_HEAD_DIM];
    alignas(32) float kt[128], va[128], vz[128];
    alignas(32) float qa[kHeadGroup * KVARN_MAX_HEAD_DIM], tmp[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(32) int16_t qi16[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(32) int8_t qi8[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(32) float s[kHeadGroup * 128];
    alignas(32) int16_t w16[kHeadGroup * 128];
    alignas(32) uint8_t w8[kHeadGroup * 128];
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const uint8_t* rec = first_record + tile * tile_stride;
        Prefetcher pf{nullptr, nullptr};
        if (tile + 1 < n_tiles) {
            pf.p = reinterpret_cast<const char*>(rec + tile_stride);
            pf.end = pf.p + L.total;
        }
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.ka), ka, D);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.kz), kz, D);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.vc), vc, D);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.kt), kt, G);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.va), va, G);
        // The integer value sums round the weights p va against their largest, so they assume va >= 0 (the
        // quantiser writes no other): a negative va in a record makes the value sums NaN (reported as
        // KVARN_ERR_OVERFLOW) instead of silently wrong.
        const bool va_negative = int_values && any_negative(va, G);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.vz), vz, G);
        // The int8 mode scores centred codes (kCentreCode): q.kz' here, the rest after the rounding.
        if (int8_scores) centred_zero_points(ka, kz, kzc, D);
        const float* kz_scored = int8_scores ? kzc : kz;
        for (int h0 = 0; h0 < n_q; h0 += kHeadGroup) {
            const int nh = n_q - h0 < kHeadGroup ? n_q - h0 : kHeadGroup;
            float qz[kHeadGroup], qscale[kHeadGroup];
            for (int h = 0; h < nh; ++h) {
                const float* q = q_rot + (size_t)(h0 + h) * D;
                __m256 z = _mm256_setzero_ps(), amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
                const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
                for (int d = 0; d < D; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(q + d);
                    const __m256 a = _mm256_mul_ps(qv, _mm256_load_ps(ka + d));
                    _mm256_store_ps(qa + h * D + d, a);
                    amax = _mm256_max_ps(amax, _mm256_and_ps(a, abs_mask));
                    if (int_scores) nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
                    z = _mm256_fmadd_ps(qv, _mm256_load_ps(kz_scored + d), z);
                }
                if (!int8_scores) qz[h] = hsum(z);
                if (int_scores) {
                    // Symmetric, as avx512: q_int = round(qa * qmax / max|qa|), saturating narrow.
                    const float qmax = int8_scores ? 127.0f : 32767.0f;
                    const float mx = hmax(amax);
                    // A NaN in ka (a corrupt record) would convert to a finite integer: carry it in the scale.
                    // So would an infinite q*ka (an Inf in ka, or a scale that overflows it): inf * 0 is NaN,
                    // which narrows to -32768 whatever the sign, and the tile would silently drop out.
                    qscale[h] = _mm256_movemask_ps(nan) || !(mx <= FLT_MAX) ? NAN : mx > 0.0f ? mx / qmax : 0.0f;
                    const __m256 inv = _mm256_set1_ps(inverse_scale(qmax, mx));
                    __m256i qsum = _mm256_setzero_si256();  // int8: sum of q_int (|q_int| <= qmax: the packs saturate none)
                    for (int d = 0; d < D; d += 16) {
                        const __m256i r0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(qa + h * D + d), inv));
                        const __m256i r1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(qa + h * D + d + 8), inv));
                        const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(r0, r1), 0xD8);
                        if (int8_scores) {
                            qsum = _mm256_add_epi32(qsum, _mm256_add_epi32(r0, r1));
                            _mm_store_si128(reinterpret_cast<__m128i*>(qi8 + h * D + d),
                                            _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
                        } else {
                            _mm256_store_si256(reinterpret_cast<__m256i*>(qi16 + h * D + d), w);
                        }
                    }
                    if (int8_scores) {  // qz = q.kz' - 7.5 qscale sum q_int = q.kz + 7.5 sum (qa - qscale q_int)
                        z = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(qsum), _mm256_set1_ps(kCentreCode * qscale[h]), z);
                        qz[h] = hsum(z);
                    }
                }
            }
            if (int_scores) {
                __m256 smax[kHeadGroup];
                for (int h = 0; h < nh; ++h) smax[h] = _mm256_set1_ps(-INFINITY);
                const ScoreArgs args{qscale, qz, kt, G, s};
                if (int8_scores && vnni)
                    scores_int8_dispatch<true>(nh, rec + L.k_codes, D, qi8, args, smax, pf);
                else if (int8_scores)
                    scores_int8_dispatch<false>(nh, rec + L.k_codes, D, qi8, args, smax, pf);
                else if (vnni)
                    scores_int16_dispatch<true>(nh, rec + L.k_codes, D, qi16, args, smax, pf);
                else
                    scores_int16_dispatch<false>(nh, rec + L.k_codes, D, qi16, args, smax, pf);
                for (int h = 0; h < nh; ++h) {
                    const int hq = h0 + h;
                    softmax_rescale(hmax(smax[h]), st.m + hq, st.l + hq, st.acc_orig + (size_t)hq * D,
                                    st.acc_rot + (size_t)hq * D, D);
                }
            } else {
                scores_dispatch<KB>(nh, rec + L.k_codes, D, G, qa, s, pf);
                for (int h = 0; h < nh; ++h) {
                    float* sh = s + h * G;
                    const __m256 qzv = _mm256_set1_ps(qz[h]);
                    for (int t = 0; t < G; t += 8)
                        _mm256_store_ps(sh + t, _mm256_mul_ps(_mm256_load_ps(kt + t), _mm256_add_ps(_mm256_load_ps(sh + t), qzv)));
                }
            }
            float pz[kHeadGroup], wscale[kHeadGroup], wsum[kHeadGroup];
            int32_t w_int_sum[kHeadGroup];
            for (int h = 0; h < nh; ++h) {
                float* sh = s + h * G;
                const int hq = h0 + h;
                if (int_mode) {
                    if (!int_scores) {
                        __m256 mx = _mm256_set1_ps(-INFINITY);
                        for (int t = 0; t < G; t += 8) mx = _mm256_max_ps(mx, _mm256_load_ps(sh + t));
                        softmax_rescale(hmax(mx), st.m + hq, st.l + hq, st.acc_orig + (size_t)hq * D,
                                        st.acc_rot + (size_t)hq * D, D);
                    }
                    if (int_values)
                        int_mode_weights<true>(sh, va, vz, st.m[hq], G, st.l + hq, pz + h, w16 + h * G,
                                               byte_values ? w8 + h * G : nullptr, wscale + h, wsum + h, w_int_sum + h,
                                               va_negative);
                    else
                        int_mode_weights<false>(sh, va, vz, st.m[hq], G, st.l + hq, pz + h, nullptr, nullptr, nullptr,
                                                nullptr, nullptr, false);
                    continue;
                }
                softmax_update(sh, G, st.m + hq, st.l + hq, st.acc_orig + (size_t)hq * D, st.acc_rot + (size_t)hq * D, D);
                // w_t = p_t va_t (in place), pz = sum_t p_t vz_t
                __m256 z = _mm256_setzero_ps();
                for (int t = 0; t < G; t += 8) {
                    const __m256 p = _mm256_load_ps(sh + t);
                    z = _mm256_fmadd_ps(p, _mm256_load_ps(vz + t), z);
                    _mm256_store_ps(sh + t, _mm256_mul_ps(p, _mm256_load_ps(va + t)));
                }
                pz[h] = hsum(z);
            }
            if (byte_values && vnni)
                values_v2_int8_dispatch<true>(nh, rec + L.v_codes, D, G, w8, w_int_sum, wscale, wsum, tmp, pf);
            else if (byte_values)
                values_v2_int8_dispatch<false>(nh, rec + L.v_codes, D, G, w8, w_int_sum, wscale, wsum, tmp, pf);
            else if (int_values && vnni)
                values_v2_int16_dispatch<true>(nh, rec + L.v_codes, D, G, w16, w_int_sum, wscale, wsum, tmp, pf);
            else if (int_values)
                values_v2_int16_dispatch<false>(nh, rec + L.v_codes, D, G, w16, w_int_sum, wscale, wsum, tmp, pf);
            else
                values_dispatch<VB>(nh, rec + L.v_codes, D, G, s, tmp, pf);
            for (int h = 0; h < nh; ++h) {
                float* acc = st.acc_rot + (size_t)(h0 + h) * D;
                const __m256 pzv = _mm256_set1_ps(pz[h]);
                for (int d = 0; d < D; d += 8) {
                    const __m256 v = _mm256_mul_ps(_mm256_load_ps(vc + d), _mm256_add_ps(_mm256_load_ps(tmp + h * D + d), pzv));
                    _mm256_storeu_ps(acc + d, _mm256_add_ps(_mm256_loadu_ps(acc + d), v));
                }
            }
        }
    }
}

template <int KB>
AttendTilesFn pick_v(int vbits)
{
    switch (vbits) {
        case 2: return attend_tiles_impl<KB, 2>;
        case 4: return attend_tiles_impl<KB, 4>;
        default: return attend_tiles_impl<KB, 8>;
    }
}

void attend_tiles_avx2(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record,
                       int64_t n_tiles, int64_t tile_stride, SoftmaxState st)
{
    AttendTilesFn fn = fmt.kbits == 2 ? pick_v<2>(fmt.vbits) : fmt.kbits == 4 ? pick_v<4>(fmt.vbits) : pick_v<8>(fmt.vbits);
    fn(q_rot, n_q, fmt, first_record, n_tiles, tile_stride, st);
}

// ---- attention over full-precision fp16 tokens ------------------------------------------------
constexpr int kDenseBlock = 64;

// s[h][t] = q[h] . k[t] for NH heads and a block of nb tokens, two tokens per
// pass so that 2*NH independent FMA chains hide the latency.
// Eight dot-product vectors v[0..7] summed horizontally at once: lane L of the
// result is the sum of v[L]'s lanes (a transpose-and-add tree: 14 shuffles and
// 7 adds for 8 sums instead of 8 separate reductions).
inline __m256 sum8(const __m256 (&v)[8])
{
    __m256 w[4];
    for (int i = 0; i < 4; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
        w[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    __m256 x[2];
    for (int j = 0; j < 2; ++j) {  // per 128-bit lane: partial sums of v[4j..4j+3]
        const __m256d a = _mm256_castps_pd(w[2 * j]), b = _mm256_castps_pd(w[2 * j + 1]);
        x[j] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(x[0], x[1], 0x20), _mm256_permute2f128_ps(x[0], x[1], 0x31));
}

// Rows of the next 64-token block towards L2 while this block computes, as in the
// avx512 file (where it is measured: only for rows of >= 256 bytes).
struct RowPrefetch {
    const uint16_t* next = nullptr;  // first row of the next block, or nullptr
    int64_t rows = 0;                // rows in the next block
    int64_t rs = 0;                  // row stride (elements)
    int row_bytes = 0;
    inline void row(int64_t r) const
    {
        if (next == nullptr || r >= rows) return;
        const char* p = reinterpret_cast<const char*>(next + r * rs);
        for (int off = 0; off < row_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
    }
};

// Scores of nb fp16 keys for NH heads; pf brings the next block's keys.
template <int NH>
void dense_scores(const float* q, int D, const uint16_t* k, int64_t nb, int64_t rs, float* s, const RowPrefetch& pf)
{
    int64_t t = 0;
    // 2 tokens x NH heads per pass, reduced together by sum8: v[4i + h] is
    // (token i, head h); a permute puts each head's two scores side by side.
    const __m256i by_head = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; t + 2 <= nb; t += 2) {
        const uint16_t* k0 = k + t * rs;
        const uint16_t* k1 = k0 + rs;
        __m256 v[8];
        for (int i = 0; i < 8; ++i) v[i] = _mm256_setzero_ps();
        pf.row(t);
        pf.row(t + 1);
        for (int d = 0; d < D; d += 8) {
            const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k0 + d)));
            const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k1 + d)));
            for (int h = 0; h < NH; ++h) {
                const __m256 qv = _mm256_loadu_ps(q + h * D + d);
                v[h] = _mm256_fmadd_ps(qv, x0, v[h]);
                v[4 + h] = _mm256_fmadd_ps(qv, x1, v[4 + h]);
            }
        }
        alignas(32) float r[8];
        _mm256_store_ps(r, _mm256_permutevar8x32_ps(sum8(v), by_head));
        for (int h = 0; h < NH; ++h) memcpy(s + h * kDenseBlock + t, r + 2 * h, 2 * sizeof(float));
    }
    for (; t < nb; ++t) {
        pf.row(t);
        const uint16_t* k0 = k + t * rs;
        __m256 a0[NH];
        for (int h = 0; h < NH; ++h) a0[h] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k0 + d)));
            for (int h = 0; h < NH; ++h) a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * D + d), x0, a0[h]);
        }
        for (int h = 0; h < NH; ++h) s[h * kDenseBlock + t] = hsum(a0[h]);
    }
}

// acc[h][d] += sum_t p[h][t] v[t][d], 16 channels at a time, accumulators in registers.
template <int NH>
void dense_values(const float* p, int D, const uint16_t* v, int64_t nb, int64_t rs, float* const* acc,
                  const RowPrefetch& pf)
{
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256 a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) {
            a0[h] = _mm256_loadu_ps(acc[h] + d0);
            a1[h] = _mm256_loadu_ps(acc[h] + d0 + 8);
        }
        const uint16_t* vr = v + d0;
        for (int64_t t = 0; t < nb; ++t, vr += rs) {
            if (d0 == 0) pf.row(t);
            const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr)));
            const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 8)));
            for (int h = 0; h < NH; ++h) {
                const __m256 pb = _mm256_broadcast_ss(p + h * kDenseBlock + t);
                a0[h] = _mm256_fmadd_ps(pb, x0, a0[h]);
                a1[h] = _mm256_fmadd_ps(pb, x1, a1[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            _mm256_storeu_ps(acc[h] + d0, a0[h]);
            _mm256_storeu_ps(acc[h] + d0 + 8, a1[h]);
        }
    }
}

void attend_dense_f16_avx2(const float* q_all, int n_q, int D, const uint16_t* k, const uint16_t* v, int64_t n,
                           int64_t row_stride, SoftmaxState st)
{
    alignas(32) float s[kHeadGroup * kDenseBlock];
    for (int64_t t0 = 0; t0 < n; t0 += kDenseBlock) {
        const int64_t nb = n - t0 < kDenseBlock ? n - t0 : kDenseBlock;
        const uint16_t* kb = k + t0 * row_stride;
        const uint16_t* vb = v + t0 * row_stride;
        const int64_t next_rows = n - t0 - nb < kDenseBlock ? n - t0 - nb : kDenseBlock;
        for (int h0 = 0; h0 < n_q; h0 += kHeadGroup) {
            const int nh = n_q - h0 < kHeadGroup ? n_q - h0 : kHeadGroup;
            const float* q = q_all + (size_t)h0 * D;
            RowPrefetch pk, pv;  // the first head group brings the next block
            if (h0 == 0 && next_rows > 0 && 2 * D >= 256) {
                pk = {kb + nb * row_stride, next_rows, row_stride, 2 * D};
                pv = {vb + nb * row_stride, next_rows, row_stride, 2 * D};
            }
            with_head_count(nh, [&](auto heads) {
                dense_scores<decltype(heads)::value>(q, D, kb, nb, row_stride, s, pk);
            });
            float* acc[kHeadGroup];
            for (int h = 0; h < nh; ++h) {
                const int hq = h0 + h;
                float* sh = s + h * kDenseBlock;
                // Pad the block to a multiple of 8 with -inf: exp gives 0 there.
                for (int64_t t = nb; t < ((nb + 7) & ~int64_t(7)); ++t) sh[t] = -INFINITY;
                softmax_update(sh, (int)((nb + 7) & ~int64_t(7)), st.m + hq, st.l + hq, st.acc_orig + (size_t)hq * D,
                               st.acc_rot + (size_t)hq * D, D);
                acc[h] = st.acc_orig + (size_t)hq * D;
            }
            with_head_count(nh, [&](auto heads) {
                dense_values<decltype(heads)::value>(s, D, vb, nb, row_stride, acc, pv);
            });
        }
    }
}

// ---- quantiser (shared with avx512: quantize_simd.inc, compiled here with this file's flags) ----
#define KVARN_SIMD_HADAMARD hadamard_rows_avx2
#include "quantize_simd.inc"
#undef KVARN_SIMD_HADAMARD

const KernelTable kAvx2 = {
    "avx2", hadamard_f32_avx2, quantize_tile_simd, attend_tiles_avx2, attend_dense_f16_avx2, to_float_simd,
};

}  // namespace

const KernelTable* avx2_kernels() { return &kAvx2; }

}  // namespace kvarn
