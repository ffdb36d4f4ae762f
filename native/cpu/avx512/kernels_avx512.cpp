// avx512 kernels. Assumes AVX-512 F/BW/VL/DQ (+ AVX2, FMA, F16C); dispatch
// checks cpuid and XGETBV (ZMM state) before this table is used. VNNI
// (vpdpwssd, vpdpbusd) runs only where avx512_vnni_on() says the CPU has it; the
// int16 kernels have a vpmaddwd + vpaddd form for AVX-512 CPUs without it.
// Built with -mavx512{f,bw,vl,dq,vnni} -mavx2 -mfma -mf16c -ffp-contract=off;
// only this file gets those flags.
//
// What each kernel must match (tests/test_simd.py checks all of it):
// - hadamard_f32: bit-identical to scalar (same butterflies and pairing).
// - quantize_tile: codes and fp16 vectors identical to scalar (quantize_simd.inc).
// - attend_tiles (float scores) / attend_dense_f16: scalar's maths
//   reassociated (fp32 FMA, blocked sums, polynomial exp, <= 2 ulp).
// - attend_tiles with int8 scores (k4 only): q*ka is rounded to int8 per
//   (tile, head) with a symmetric scale max|q*ka|/127, and dotted with the 4-bit
//   codes exactly in int32 (vpdpbusd); 2-bit values' weights p*va likewise to
//   uint8 against max/255, summed exactly in int32 (vpdpbusd); the extra error is
//   what that rounding costs (measured in docs/simd.md). The float path stays selectable.
//
// Link hygiene as in kernels_avx2.cpp: no header templates or inline library
// functions are instantiated here, everything lives in an anonymous namespace.
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "dispatch.h"
#include "kvarn/kernels.h"
#include "sinkhorn.h"

namespace kvarn {
namespace {

// Pulls the next record towards L1 a line at a time from inside the compute
// loops, so the misses overlap with arithmetic; records of one head are a whole
// cache row apart, beyond the reach of the hardware's stride prefetcher, and a
// burst of 200+ prefetches would only stall on the line-fill buffers.
// The record after it goes towards L2 at the same pace: from DRAM, L1 misses in
// flight for a whole latency each capped these kernels' rate (the next record's
// lines then come from L2 in a few cycles). The avx2 file keeps one record: its
// records take longer, and the extra prefetch measured slower there.
struct Prefetcher {
    const char* p;
    const char* end;
    ptrdiff_t ahead;  // from p to the same line of the record after (0 with none: the line again, a no-op)
    inline void step()
    {
        if (p < end) {
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + ahead, _MM_HINT_T1);
            p += 64;
        }
    }
};

// exp(x) for x <= 0: the same range reduction and polynomial as the avx2
// file (<= 2 ulp on [-87, 0]); below -87.3 returns 0. NaN stays NaN (the mask keeps
// unordered lanes; max/min return their second operand when one is NaN), so a corrupt
// record's NaN reaches the output's finiteness check, as on the scalar kernels.
inline __m512 exp_ps(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.3365447505531f);
    const __mmask16 ok = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lo, x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    // y * 2^n in one vscalefps (exact, as the multiplication by a built 2^n is
    // for n >= -126, which the clamp above guarantees)
    return _mm512_maskz_scalef_ps(ok, y, n);
}

// exp(x) for x <= 0 in the integer score modes, whose weights are rounded to 15
// bits anyway: 2^(x log2 e) with a degree-5 polynomial for 2^f, |f| <= 1/2
// (<= 2.4e-7 relative in fp32, fitted for relative error; plus |x| (2^-24 + 1.34e-8)
// from rounding x log2 e and the fp32 log2 e), and vscalefps: 10 instructions where
// exp_ps takes 17. t is clamped at -127 (2^-127, which the int16 weights round to 0)
// so that x = -inf (an infinite kz or kt) gives ~0 as in the avx2 file, not
// (-inf) - (-inf) = NaN; NaN stays NaN (vmaxps returns its second operand).
inline __m512 exp_int_mode_ps(__m512 x)
{
    const __m512 t = _mm512_max_ps(_mm512_set1_ps(-127.0f), _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 y = _mm512_set1_ps(1.327647129073739e-3f);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.675541892647743e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.550713092088699e-2f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022120237350464e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.931469440460205e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0000001192092896f));
    return _mm512_scalef_ps(y, n);
}

// qmax / max, the factor that rounds values up to max to integers up to qmax. 0 (every integer 0) for max <= 0,
// NaN, or below ~1e-34, where the quotient is inf and inf (or 0 * inf) products would convert to INT_MIN:
// values that small add nothing next to the softmax's largest weight (1) and the query's other tiles.
inline float inverse_scale(float qmax, float max)
{
    const float inv = qmax / max;
    return max > 0.0f && inv <= FLT_MAX ? inv : 0.0f;
}

inline void f16_to_f32(const uint16_t* src, float* dst, int n)  // n % 16 == 0
{
    for (int i = 0; i < n; i += 16)
        _mm512_store_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
}

// 16 codes of a packed row starting at code i0 (a multiple of 16), as floats.
template <int B>
inline __m512 codes16(const uint8_t* row, int i0);

// vpermps looks at the low 4 bits of each index only, so after the shift a
// table lookup does the mask and the int->float conversion in one instruction.
inline __m512 lut2()
{
    return _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
}
inline __m512 lut4()
{
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

template <>
inline __m512 codes16<2>(const uint8_t* row, int i0)
{
    uint32_t w;
    memcpy(&w, row + i0 / 4, 4);
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(_mm512_set1_epi32((int)w), sh), lut2());
}

template <>
inline __m512 codes16<4>(const uint8_t* row, int i0)
{
    const __m512i x = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                               _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i0 / 2))));
    const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(x, sh), lut4());
}

template <>
inline __m512 codes16<8>(const uint8_t* row, int i0)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i0))));
}

// ---- Hadamard ---------------------------------------------------------------------
// In-register stages h = 1, 2, 4, 8: y = x with partners swapped; lanes with
// bit h clear take x + y (a + b), the others y - x (a - b): the scalar's operands.
// One butterfly stage inside a vector: lanes without the sign bit become x + y,
// lanes with it y - x (y = x's partner lane), as x * (+-1) + y in one FMA, which is
// exact (x * +-1 is) and rounds like the add or sub it replaces: bit-identical, on
// the FMA pipes, where an add + masked sub took two ops on the adder pipes.
inline __m512 butterfly(__m512 x, __m512 y, __m512 sign) { return _mm512_fmadd_ps(x, sign, y); }

inline __m512 fwht16(__m512 x)
{
    const __m512 s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    const __m512 s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
    const __m512 s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
    const __m512 s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
    x = butterfly(x, _mm512_permute_ps(x, 0xB1), s1);
    x = butterfly(x, _mm512_permute_ps(x, 0x4E), s2);
    x = butterfly(x, _mm512_shuffle_f32x4(x, x, 0xB1), s4);  // 128-bit lanes 1 0 3 2
    return butterfly(x, _mm512_shuffle_f32x4(x, x, 0x4E), s8);  // 2 3 0 1
}

// The cross-vector butterflies of distance H, 2H, ... < NV: one template level per stage, so
// every loop has constant bounds and unrolls (with one loop over h <<= 1, GCC 12 kept v[] on
// the stack: 8 spills and reloads per row).
template <int NV, int H>
inline void cross_stages(__m512 (&v)[NV])
{
    if constexpr (H < NV) {
        for (int i = 0; i < NV; i += 2 * H)
            for (int j = i; j < i + H; ++j) {
                const __m512 a = v[j], c = v[j + H];
                v[j] = _mm512_add_ps(a, c);                                // adder pipes
                v[j + H] = _mm512_fnmadd_ps(c, _mm512_set1_ps(1.0f), a);  // a - c, exactly, on the FMA pipes
            }
        cross_stages<NV, 2 * H>(v);
    }
}

// The vector width convert_simd.inc is written for.
using SimdVec = __m512;
constexpr int kSimdLanes = 16;
inline SimdVec simd_load_f32(const float* p) { return _mm512_loadu_ps(p); }
inline SimdVec simd_load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline SimdVec simd_round_to_f16(SimdVec x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }
inline SimdVec simd_mul(SimdVec a, SimdVec b) { return _mm512_mul_ps(a, b); }
inline SimdVec simd_fwht_lanes(SimdVec x) { return fwht16(x); }  // the butterflies within a vector
inline void simd_store(float* p, SimdVec x) { _mm512_storeu_ps(p, x); }

#include "convert_simd.inc"

// dst = Hadamard of src (rows in input_type's format, KVARN_INPUT_*), row by row (dst may equal src).
void hadamard_rows_avx512(const void* src, int input_type, float* dst, int64_t rows, int head_dim)
{
    const int block = kvarn_hadamard_block(head_dim);  // >= 16
    const __m512 norm = _mm512_set1_ps((float)(1.0 / sqrt((double)block)));
    switch (block / 16) {
        case 1: return hadamard_rows_in_registers<1>(src, input_type, dst, rows, head_dim, norm);
        case 2: return hadamard_rows_in_registers<2>(src, input_type, dst, rows, head_dim, norm);
        case 4: return hadamard_rows_in_registers<4>(src, input_type, dst, rows, head_dim, norm);
        case 8: return hadamard_rows_in_registers<8>(src, input_type, dst, rows, head_dim, norm);
        default: break;
    }
    // Blocks of 256 and more: the input as float32 in dst, then the transform in place there.
    to_float_simd(src, input_type, dst, rows * head_dim);
    for (int64_t r = 0; r < rows; ++r) {
        float* row = dst + r * head_dim;
        for (int b = 0; b < head_dim; b += block) {
            float* p = row + b;
            for (int i = 0; i < block; i += 16) _mm512_storeu_ps(p + i, fwht16(_mm512_loadu_ps(p + i)));
            for (int h = 16; h < block; h <<= 1)
                for (int i = 0; i < block; i += 2 * h)
                    for (int j = i; j < i + h; j += 16) {
                        const __m512 a = _mm512_loadu_ps(p + j), c = _mm512_loadu_ps(p + j + h);
                        _mm512_storeu_ps(p + j, _mm512_add_ps(a, c));
                        _mm512_storeu_ps(p + j + h, _mm512_sub_ps(a, c));
                    }
        }
        for (int d = 0; d < head_dim; d += 16) _mm512_storeu_ps(row + d, _mm512_mul_ps(_mm512_loadu_ps(row + d), norm));
    }
}

void hadamard_f32_avx512(float* x, int64_t rows, int head_dim) { hadamard_rows_avx512(x, KVARN_INPUT_F32, x, rows, head_dim); }

// acc + dot products. GCC 12 compiles _mm512_dpwssd_epi32 / _mm512_dpbusd_epi32
// over an accumulator array with two register copies per accumulator per
// iteration (24 extra moves per channel pair in the scores loop, seen with perf
// annotate); asm that ties the accumulator to its output keeps it in place.
// By value, not by reference: a reference makes GCC keep the array on the stack.
// kVnni false: vpmaddwd + vpaddd, the same int32 sums for AVX-512 CPUs without VNNI
// (Skylake-SP/X); the add is asm too, so GCC (this file has -mavx512vnni) cannot fuse
// the pair into a vpdpwssd that such a CPU could not run.
template <bool kVnni>
inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b)
{
    if constexpr (kVnni) {
        asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    } else {
        const __m512i prod = _mm512_madd_epi16(a, b);
        asm("vpaddd %1, %0, %0" : "+v"(acc) : "v"(prod));
    }
    return acc;
}
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b)
{
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}
// AVX-512 VBMI's byte permutes, as asm for the same reason: this file is built without -mavx512vbmi, so the
// compiler cannot put VBMI instructions where the CPU may lack them (Skylake-SP/X, Cascade Lake); these run
// only where avx512_vbmi_on(). vpermb: table's byte idx[i] & 63. vpermt2b: a's byte idx[i] & 63, or b's where
// idx[i] & 64.
inline __m512i vpermb(__m512i idx, __m512i table)
{
    __m512i out;
    asm("vpermb %2, %1, %0" : "=v"(out) : "v"(idx), "v"(table));
    return out;
}
inline __m512i vpermb_zero(__mmask64 keep, __m512i idx, __m512i table)  // bytes outside keep are 0
{
    __m512i out;
    asm("vpermb %2, %1, %0%{%3%}%{z%}" : "=v"(out) : "v"(idx), "v"(table), "Yk"(keep));
    return out;
}
inline __m512i vpermt2b(__m512i a, __m512i idx, __m512i b)
{
    asm("vpermt2b %2, %1, %0" : "+v"(a) : "v"(idx), "v"(b));
    return a;
}
inline __m512i vpermt2b_zero(__mmask64 keep, __m512i a, __m512i idx, __m512i b)  // bytes outside keep are 0
{
    asm("vpermt2b %2, %1, %0%{%3%}%{z%}" : "+v"(a) : "v"(idx), "v"(b), "Yk"(keep));
    return a;
}

// ---- attention over quantised tiles --------------------------------------------------------
constexpr int kHeadGroup = 4;

// The int8 score mode scores centred 4-bit codes c - 7.5: with kz' = kz + 7.5 ka the score is
// kt (sum_d qa_d (c - 7.5) + q.kz'), and the rounded query gives kt (qscale (sum q_int c - 7.5 sum q_int)
// + q.kz'). Its rounding error sum_d (qa_d - qscale q_int_d)(c - 7.5) is half of the uncentred
// sum_d (qa_d - qscale q_int_d) c or less: a channel's codes spread ~3 around a mean near 7.5
// (docs/simd.md). int16 keeps the uncentred form: its error is already ~4e-5 of the output.
constexpr float kCentreCode = 7.5f;

// kzc = kz + 7.5 ka (one rounding), the zero points of the centred codes; n % 16 == 0.
inline void centred_zero_points(const float* ka, const float* kz, float* kzc, int n)
{
    const __m512 c0 = _mm512_set1_ps(kCentreCode);
    for (int i = 0; i < n; i += 16)
        _mm512_store_ps(kzc + i, _mm512_fmadd_ps(_mm512_load_ps(ka + i), c0, _mm512_load_ps(kz + i)));
}

// Float scores: s[h][t] = sum_d qa[h][d] code[d][t], 32 tokens per pass, the
// unpacked codes shared by NH heads.
template <int KB, int NH>
void tile_scores(const uint8_t* kc, int D, int G, const float* qa, float* s, Prefetcher& pf)
{
    const size_t row_bytes = (size_t)G * KB / 8;
    for (int t0 = 0; t0 < G; t0 += 32) {
        __m512 a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) a0[h] = a1[h] = _mm512_setzero_ps();
        const uint8_t* p = kc;
        for (int d = 0; d < D; ++d, p += row_bytes) {
            if ((d & 1) == 0) pf.step();
            const __m512 c0 = codes16<KB>(p, t0), c1 = codes16<KB>(p, t0 + 16);
            for (int h = 0; h < NH; ++h) {
                const __m512 qb = _mm512_set1_ps(qa[h * D + d]);
                a0[h] = _mm512_fmadd_ps(qb, c0, a0[h]);
                a1[h] = _mm512_fmadd_ps(qb, c1, a1[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            _mm512_store_ps(s + h * G + t0, a0[h]);
            _mm512_store_ps(s + h * G + t0 + 16, a1[h]);
        }
    }
}

// 4-bit keys, float: 16 bytes of a row hold 32 tokens; zero-extend to dwords
// once, then one table lookup per nibble gives the even and the odd tokens
// (2 ops per 16 codes instead of 3); interleaved back to token order at the end.
template <int NH>
void tile_scores_k4(const uint8_t* kc, int D, int G, const float* qa, float* s, Prefetcher& pf)
{
    const size_t row_bytes = (size_t)G / 2;
    const __m512 lut = lut4();
    const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int t0 = 0; t0 < G; t0 += 32) {
        __m512 a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) a0[h] = a1[h] = _mm512_setzero_ps();
        const uint8_t* p = kc + t0 / 2;
        for (int d = 0; d < D; ++d, p += row_bytes) {
            if ((d & 1) == 0) pf.step();
            const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
            const __m512 c0 = _mm512_permutexvar_ps(x, lut);                         // even tokens
            const __m512 c1 = _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), lut);   // odd tokens
            for (int h = 0; h < NH; ++h) {
                const __m512 qb = _mm512_set1_ps(qa[h * D + d]);
                a0[h] = _mm512_fmadd_ps(qb, c0, a0[h]);
                a1[h] = _mm512_fmadd_ps(qb, c1, a1[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            _mm512_store_ps(s + h * G + t0, _mm512_permutex2var_ps(a0[h], lo_idx, a1[h]));
            _mm512_store_ps(s + h * G + t0 + 16, _mm512_permutex2var_ps(a0[h], hi_idx, a1[h]));
        }
    }
}

// What the integer score kernels need to finish a tile's scores: per head the
// query's scale and zero-point term (qscale, qz), the tile's token scales kt,
// and where the G scores of each head go.
struct ScoreArgs {
    const float* qscale;
    const float* qz;
    const float* kt;
    int G;
    float* s;  // [NH][G]
};

// Token order of the integer score kernels' accumulators: within a 64-token half, byte
// position p of a row (p < 32: low nibbles = even tokens 2p, else odd tokens
// 2(p-32)+1) lands in accumulator j = (p % 16) / 4, lane (p / 16) * 4 + p % 4.
// Built at compile time (constexpr): a runtime constructor here would run at
// load time with AVX-512 instructions, before dispatch has looked at the CPU.
struct ScoreOrder {
    alignas(64) int32_t idx[4][16];  // tokens 16b..16b+15: lanes of acc[2(b%2)] (0..15) and acc[2(b%2)+1] (16..31)
};
constexpr ScoreOrder make_score_order()
{
    ScoreOrder o{};
    for (int t = 0; t < 64; ++t) {
        const int p = (t % 2 == 0) ? t / 2 : 32 + t / 2;
        const int j = (p % 16) / 4, lane = (p / 16) * 4 + p % 4;  // j / 2 == (t / 16) % 2 for every t
        o.idx[t / 16][t % 16] = lane + 16 * (j % 2);
    }
    return o;
}
constexpr ScoreOrder kScoreOrder = make_score_order();

// The accumulators of tile_scores_k4_int16's VBMI layout: j 0 / 1 the even tokens 2i / 32 + 2i of
// a 64-token half (lane i), j 2 / 3 the odd tokens 2i + 1 / 33 + 2i.
struct ScoreOrderVbmi {
    alignas(64) uint8_t pair[2][64];  // vpermb index: dword i of output k = bytes n[16k + i], n[32 + 16k + i] as words
    alignas(64) int32_t idx[2][16];   // token 16b + t: even[b / 2] lane 8 (b % 2) + t / 2, or that + 16 (odd[b / 2])
};
constexpr ScoreOrderVbmi make_score_order_vbmi()
{
    ScoreOrderVbmi o{};
    for (int k = 0; k < 2; ++k)
        for (int i = 0; i < 16; ++i) {  // word 2i: row d's byte 16k + i; word 2i + 1: row d + 1's (n byte 32 + 16k + i)
            o.pair[k][4 * i] = (uint8_t)(16 * k + i);
            o.pair[k][4 * i + 2] = (uint8_t)(32 + 16 * k + i);
        }
    for (int b = 0; b < 2; ++b)
        for (int t = 0; t < 16; ++t) o.idx[b][t] = 8 * b + t / 2 + (t % 2 ? 16 : 0);
    return o;
}
constexpr ScoreOrderVbmi kScoreOrderVbmi = make_score_order_vbmi();

// Epilogue shared by the integer score kernels: 64 tokens' int32 sums per head,
// put into token order (one two-source permute per 16 tokens) and finished as
// s = kt * (sum * qscale + qz); smax[h] keeps the running maximum. The accumulators' layouts:
// kScoresPlain (kScoreOrder), kScoresHighTimes16 (the same, the upper 256 bits of each sum holding 16x the
// codes' sum: high nibbles masked in place, exactly), kScoresVbmi (kScoreOrderVbmi: the even tokens' sums
// carry 16x their odd neighbours', taken out exactly).
enum { kScoresPlain = 0, kScoresHighTimes16 = 1, kScoresVbmi = 2 };
template <int NH, int kLayout>
inline void finish_int_scores(const __m512i (&acc)[NH][4], const ScoreArgs& a, int half, __m512* smax)
{
    const __m512i high_by_16 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    for (int h = 0; h < NH; ++h) {
        const __m512 sc = _mm512_set1_ps(a.qscale[h]), z = _mm512_set1_ps(a.qz[h]);
        __m512 f[4];
        for (int j = 0; j < 4; ++j) {
            __m512i sum = acc[h][j];
            if (kLayout == kScoresHighTimes16) sum = _mm512_srav_epi32(sum, high_by_16);
            if (kLayout == kScoresVbmi) sum = j < 2 ? _mm512_sub_epi32(sum, acc[h][j + 2]) : _mm512_srai_epi32(sum, 4);
            f[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), sc);
        }
        for (int b = 0; b < 4; ++b) {
            const int t = half * 64 + 16 * b;
            const __m512 v = kLayout == kScoresVbmi
                                 ? _mm512_permutex2var_ps(f[b / 2], _mm512_load_si512(kScoreOrderVbmi.idx[b % 2]), f[2 + b / 2])
                                 : _mm512_permutex2var_ps(f[2 * (b % 2)], _mm512_load_si512(kScoreOrder.idx[b]), f[2 * (b % 2) + 1]);
            const __m512 sv = _mm512_mul_ps(_mm512_load_ps(a.kt + t), _mm512_add_ps(v, z));
            _mm512_store_ps(a.s + h * a.G + t, sv);
            smax[h] = _mm512_max_ps(smax[h], sv);
        }
    }
}

// Int8 scores for 4-bit keys (VNNI): for each group of 4 channels the 4 rows'
// nibbles are interleaved so that each dword holds one token's 4 codes, then
// vpdpbusd multiplies them by the 4 int8 query values and sums in int32.
// qi: [NH][D] int8; finished by finish_int_scores.
template <int NH>
void tile_scores_k4_int8(const uint8_t* kc, int D, const int8_t* qi, const ScoreArgs& a, __m512* smax, Prefetcher& pf)
{
    const int G = a.G;
    const size_t row_bytes = (size_t)G / 2;
    // low 256 bits: the low nibbles; high: the high nibbles masked in place (16 c <= 240, a byte
    // still: no shift, an extra operation on the ports the vpdpbusd issue on; finish divides by 16)
    const __m512i nib = _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8((char)0xF0), 1);
    for (int half = 0; half < G / 64; ++half) {
        __m512i acc[NH][4];
        for (int h = 0; h < NH; ++h)
            for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_setzero_si512();
        const uint8_t* p = kc + half * 32;
        for (int d = 0; d < D; d += 4, p += 4 * row_bytes) {
            pf.step();
            pf.step();
            __m512i n[4];
            for (int r = 0; r < 4; ++r) {
                const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + r * row_bytes)));
                n[r] = _mm512_and_si512(x, nib);
            }
            const __m512i u01l = _mm512_unpacklo_epi8(n[0], n[1]), u01h = _mm512_unpackhi_epi8(n[0], n[1]);
            const __m512i u23l = _mm512_unpacklo_epi8(n[2], n[3]), u23h = _mm512_unpackhi_epi8(n[2], n[3]);
            const __m512i w0 = _mm512_unpacklo_epi16(u01l, u23l), w1 = _mm512_unpackhi_epi16(u01l, u23l);
            const __m512i w2 = _mm512_unpacklo_epi16(u01h, u23h), w3 = _mm512_unpackhi_epi16(u01h, u23h);
            for (int h = 0; h < NH; ++h) {
                int32_t q4;
                memcpy(&q4, qi + h * D + d, 4);
                const __m512i qb = _mm512_set1_epi32(q4);
                acc[h][0] = dpbusd(acc[h][0], w0, qb);
                acc[h][1] = dpbusd(acc[h][1], w1, qb);
                acc[h][2] = dpbusd(acc[h][2], w2, qb);
                acc[h][3] = dpbusd(acc[h][3], w3, qb);
            }
        }
        finish_int_scores<NH, kScoresHighTimes16>(acc, a, half, smax);
    }
}

// acc[h][j] += w[j]'s int16 pairs times head h's query pair (qi[h][d], qi[h][d + 1]): tile_scores_k4_int16's step.
template <int NH, bool kVnni>
inline void dot_code_pairs(__m512i (&acc)[NH][4], const __m512i (&w)[4], const int16_t* qi, int D, int d)
{
    for (int h = 0; h < NH; ++h) {
        int32_t q2;
        memcpy(&q2, qi + h * D + d, 4);
        const __m512i qb = _mm512_set1_epi32(q2);
        for (int j = 0; j < 4; ++j) acc[h][j] = dpwssd<kVnni>(acc[h][j], w[j], qb);
    }
}

// Int16 scores for 4-bit keys (VNNI vpdpwssd): rows d and d+1 are laid out so that each dword holds one
// token's two codes as int16, multiplied by the int16 pair (q16[d], q16[d+1]) and summed exactly in int32
// (|sum| <= 2*15*32768 per pair, D/2 pairs: fits for D <= 1024). Three layouts (finish_int_scores):
// - kScoresPlain: the rows broadcast to both halves of a register, the upper half shifted by a nibble, masked
//   and interleaved into words by unpacks (same token order as the int8 path; any head_dim);
// - kScoresHighTimes16: the same with the high nibbles masked in place as 16 c (no shift beside the vpdpwssd,
//   whose ports bound the loop), which fits int32 while D/2 * 2*240*32767 < 2^31: to D 272 (used to 256);
// - kScoresVbmi (AVX-512 VBMI, head_dim <= 256): the same int32 sums on fewer layout operations. Rows d and d+1
//   share one register n (a load and an insert), and four zero-masked vpermb lay out its bytes as (row d,
//   row d+1) word pairs: from n itself for the even tokens, which then carry their odd neighbour's high nibble
//   too (a word is c_even + 16 c_odd), and from n & 0xF0 for the odd ones (16 c_odd). So one and where the
//   broadcast forms need two, and four permutes for their six unpacks. The finish takes the odd tokens' sums out
//   of the even ones' exactly: S_even = acc_even - acc_odd, S_odd = acc_odd / 16 (an exact shift);
//   acc_even <= D/2 * 2 * 255 * 32768 < 2^31 for D <= 256.
template <int NH, bool kVnni, int kLayout>
void tile_scores_k4_int16(const uint8_t* kc, int D, const int16_t* qi, const ScoreArgs& a, __m512* smax,
                          Prefetcher& pf)
{
    const int G = a.G;
    const size_t row_bytes = (size_t)G / 2;
    // the broadcast layouts
    const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i nib = kLayout == kScoresHighTimes16
                            ? _mm512_inserti64x4(_mm512_set1_epi8(0x0F), _mm256_set1_epi8((char)0xF0), 1)
                            : _mm512_set1_epi8(0x0F);
    const __m512i zero = _mm512_setzero_si512();
    // the VBMI layout
    const __m512i high = _mm512_set1_epi8((char)0xF0);
    const __m512i pair0 = _mm512_load_si512(kScoreOrderVbmi.pair[0]), pair1 = _mm512_load_si512(kScoreOrderVbmi.pair[1]);
    const __mmask64 low_bytes = 0x5555555555555555ull;  // each word's low byte: the code; the high byte 0
    for (int half = 0; half < G / 64; ++half) {
        __m512i acc[NH][4];
        for (int h = 0; h < NH; ++h)
            for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_setzero_si512();
        const uint8_t* p = kc + half * 32;
        for (int d = 0; d < D; d += 2, p += 2 * row_bytes) {
            pf.step();
            __m512i w[4];
            if constexpr (kLayout == kScoresVbmi) {
                const __m512i n = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + row_bytes)), 1);
                const __m512i n_high = _mm512_and_si512(n, high);
                w[0] = vpermb_zero(low_bytes, pair0, n);
                w[1] = vpermb_zero(low_bytes, pair1, n);
                w[2] = vpermb_zero(low_bytes, pair0, n_high);
                w[3] = vpermb_zero(low_bytes, pair1, n_high);
            } else {
                __m512i n0 = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
                __m512i n1 = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + row_bytes)));
                if (kLayout == kScoresPlain) {
                    n0 = _mm512_srlv_epi64(n0, shift);
                    n1 = _mm512_srlv_epi64(n1, shift);
                }
                n0 = _mm512_and_si512(n0, nib);
                n1 = _mm512_and_si512(n1, nib);
                const __m512i e = _mm512_unpacklo_epi8(n0, n1), f = _mm512_unpackhi_epi8(n0, n1);
                w[0] = _mm512_unpacklo_epi8(e, zero);
                w[1] = _mm512_unpackhi_epi8(e, zero);
                w[2] = _mm512_unpacklo_epi8(f, zero);
                w[3] = _mm512_unpackhi_epi8(f, zero);
            }
            dot_code_pairs<NH, kVnni>(acc, w, qi, D, d);
        }
        finish_int_scores<NH, kLayout>(acc, a, half, smax);
    }
}

// tmp[h][d] = sum_t w[h][t] code[t][d]; C 16-channel vectors per pass.
template <int VB, int NH, int C>
inline void values_chunk(const uint8_t* vcodes, size_t row_bytes, int D, int G, int d0, const float* w, float* tmp,
                         Prefetcher& pf)
{
    __m512 a[NH][C];
    for (int h = 0; h < NH; ++h)
        for (int c = 0; c < C; ++c) a[h][c] = _mm512_setzero_ps();
    const uint8_t* p = vcodes;
    for (int t = 0; t < G; ++t, p += row_bytes) {
        if ((t & 1) == 0) pf.step();
        __m512 x[C];
        for (int c = 0; c < C; ++c) x[c] = codes16<VB>(p, d0 + 16 * c);
        for (int h = 0; h < NH; ++h) {
            const __m512 wb = _mm512_set1_ps(w[h * G + t]);
            for (int c = 0; c < C; ++c) a[h][c] = _mm512_fmadd_ps(wb, x[c], a[h][c]);
        }
    }
    for (int h = 0; h < NH; ++h)
        for (int c = 0; c < C; ++c) _mm512_store_ps(tmp + h * D + d0 + 16 * c, a[h][c]);
}

template <int VB, int NH>
void tile_values(const uint8_t* vcodes, int D, int G, const float* w, float* tmp, Prefetcher& pf)
{
    const size_t row_bytes = (size_t)D * VB / 8;
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) values_chunk<VB, NH, 4>(vcodes, row_bytes, D, G, d0, w, tmp, pf);
    for (; d0 + 32 <= D; d0 += 32) values_chunk<VB, NH, 2>(vcodes, row_bytes, D, G, d0, w, tmp, pf);
    for (; d0 < D; d0 += 16) values_chunk<VB, NH, 1>(vcodes, row_bytes, D, G, d0, w, tmp, pf);
}

// The codes of tokens t..t+3 for channels d0 .. d0+16C-1 (rows row_bytes apart), as
// one register whose dword b holds byte b of each of the four rows (channels 4b..4b+3,
// token r in byte r). Three forms (kQuads*), the same register:
// - Insert (any CPU, any head_dim): row r goes to lane r (a load and three inserts), a vpermd
//   gathers dword L of every row into lane L and an in-lane vpshufb transposes each lane's 4x4 bytes;
// - Vpermb (VBMI, a 64-channel chunk of head_dim 64, whose four 16-byte rows lie end to end):
//   one 64-byte load and one vpermb;
// - Vpermt2b (VBMI, a 64-channel chunk with row_bytes <= 32, i.e. head_dim <= 128): two 64-byte loads
//   (from rows 0 and 2) and one vpermt2b. The second reads up to 48 - row_bytes bytes past the chunk's
//   bytes in row 3, inside the record (its vc, va and vz follow the value codes).
// The value loops are bound by the issue of their vector operations (docs/simd.md, Kernels item 5): the
// permutes replace five of them (two p5-only shuffles, three inserts) by one (vpermt2b: two).
enum { kQuadsInsert = 0, kQuadsVpermb = 1, kQuadsVpermt2b = 2 };

// The byte permute for the VBMI forms: output byte 16L + 4b + r is byte 4L + b of row r, which sits at
// r * row_bytes from the first load (Vpermb), or at 64 (r / 2) + row_bytes (r % 2) across the two (Vpermt2b).
struct QuadPattern {
    alignas(64) uint8_t base[64];  // 4L + b
    uint64_t odd_row, high_row;    // the bytes with r odd, r >= 2
};
constexpr QuadPattern make_quad_pattern()
{
    QuadPattern q{};
    for (int i = 0; i < 64; ++i) {
        const int L = i / 16, b = (i / 4) % 4, r = i % 4;
        q.base[i] = (uint8_t)(4 * L + b);
        if (r % 2) q.odd_row |= 1ull << i;
        if (r / 2) q.high_row |= 1ull << i;
    }
    return q;
}
constexpr QuadPattern kQuadPattern = make_quad_pattern();

// The permute index as if every row were row 0 or 2 (rows 1 and 3 are row_bytes further on).
template <int Q>
inline __m512i quad_index_rows_0_2(size_t row_bytes)
{
    const __m512i base = _mm512_load_si512(kQuadPattern.base);
    const int high = Q == kQuadsVpermb ? 2 * (int)row_bytes : 64;
    return _mm512_mask_add_epi8(base, kQuadPattern.high_row, base, _mm512_set1_epi8((char)high));
}
template <int Q>
inline __m512i quad_permute(size_t row_bytes)
{
    if constexpr (Q == kQuadsInsert) {
        return _mm512_setzero_si512();  // unused
    } else {
        const __m512i rows_0_2 = quad_index_rows_0_2<Q>(row_bytes);
        return _mm512_mask_add_epi8(rows_0_2, kQuadPattern.odd_row, rows_0_2, _mm512_set1_epi8((char)row_bytes));
    }
}

// The int16 value loop's two registers with the VBMI forms: the codes of tokens t and t+2 (even) and t+1 and t+3
// (odd) as words, bytes as in load_code_quads, each word's high byte 0 (a zero-masked permute each, where the
// form without VBMI shifts the quads' words).
struct QuadPairPermutes {
    __m512i even, odd;
};
template <int Q>
inline QuadPairPermutes quad_pair_permutes(size_t row_bytes)
{
    const __m512i even = quad_index_rows_0_2<Q>(row_bytes);
    return {even, _mm512_add_epi8(even, _mm512_set1_epi8((char)row_bytes))};
}
template <int Q>
inline void load_code_pairs(const uint8_t* p, size_t row_bytes, const QuadPairPermutes& permute, __m512i& even,
                            __m512i& odd)
{
    constexpr __mmask64 low_bytes = 0x5555555555555555ull;
    if constexpr (Q == kQuadsVpermb) {
        const __m512i rows = _mm512_loadu_si512(p);
        even = vpermb_zero(low_bytes, permute.even, rows);
        odd = vpermb_zero(low_bytes, permute.odd, rows);
    } else {
        const __m512i rows01 = _mm512_loadu_si512(p), rows23 = _mm512_loadu_si512(p + 2 * row_bytes);
        even = vpermt2b_zero(low_bytes, rows01, permute.even, rows23);
        odd = vpermt2b_zero(low_bytes, rows01, permute.odd, rows23);
    }
}

template <int C, int Q>
inline __m512i load_code_quads(const uint8_t* p, size_t row_bytes, __m512i permute)
{
    static_assert(Q == kQuadsInsert || C == 4, "the permute forms serve whole 64-channel chunks");
    if constexpr (Q == kQuadsVpermb) {
        return vpermb(permute, _mm512_loadu_si512(p));
    } else if constexpr (Q == kQuadsVpermt2b) {
        return vpermt2b(_mm512_loadu_si512(p), permute, _mm512_loadu_si512(p + 2 * row_bytes));
    } else {
        const __mmask16 bytes = (__mmask16)((1u << (4 * C)) - 1);  // 4 bytes per 16 channels; never reads past the row
        __m512i rows;
        if (C == 4) {
            rows = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
            rows = _mm512_inserti32x4(rows, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + row_bytes)), 1);
            rows = _mm512_inserti32x4(rows, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * row_bytes)), 2);
            rows = _mm512_inserti32x4(rows, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * row_bytes)), 3);
        } else {
            rows = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(bytes, p));
            rows = _mm512_inserti32x4(rows, _mm_maskz_loadu_epi8(bytes, p + row_bytes), 1);
            rows = _mm512_inserti32x4(rows, _mm_maskz_loadu_epi8(bytes, p + 2 * row_bytes), 2);
            rows = _mm512_inserti32x4(rows, _mm_maskz_loadu_epi8(bytes, p + 3 * row_bytes), 3);
        }
        const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        const __m512i transpose = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
        return _mm512_shuffle_epi8(_mm512_permutexvar_epi32(lanes, rows), transpose);
    }
}

// The lanes' sum, wrapping as the hardware's adds do. GCC's _mm512_reduce_add_epi32 adds in plain int, where
// overflow is undefined: a NaN weight (a corrupt record; the call then returns KVARN_ERR_OVERFLOW) converts to
// INT_MIN, and UBSan stopped the Python suite there on the Xeon (thirty-ninth session).
inline int32_t reduce_add_epi32_wrapping(__m512i v)
{
    const __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0x4E));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0xB1));
    return _mm_cvtsi128_si32(b);
}

// tmp = (wscale (2 S - 3 W) + 3 wsum) / 2 for the exact sums S[k] (lane b: channel 4b + k)
// of one head, stored in channel order: a 4x4 transpose inside each 128-bit lane, then of the lanes.
template <int C>
inline void store_value_sums(const __m512i (&S)[4], int32_t w_sum, float wscale, float wsum, float* out)
{
    const __m512 sc = _mm512_set1_ps(0.5f * wscale), off = _mm512_set1_ps(1.5f * wsum);
    // unsigned: wraps instead of overflowing where a NaN weight (a corrupt record) made w_sum garbage
    const __m512i w3 = _mm512_set1_epi32((int32_t)(3u * (uint32_t)w_sum));
    __m512 y[4];
    for (int k = 0; k < 4; ++k)
        y[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_slli_epi32(S[k], 1), w3)), sc, off);
    const __m512 t0 = _mm512_unpacklo_ps(y[0], y[1]), t1 = _mm512_unpackhi_ps(y[0], y[1]);
    const __m512 t2 = _mm512_unpacklo_ps(y[2], y[3]), t3 = _mm512_unpackhi_ps(y[2], y[3]);
    const __m512 z0 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
    const __m512 z1 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
    const __m512 z2 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
    const __m512 z3 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
    // z[i] lane j: channels 16j + 4i .. 4i+3
    const __m512 u0 = _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u1 = _mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u2 = _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 u3 = _mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(3, 2, 3, 2));
    _mm512_store_ps(out, _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)));
    if (C > 1) _mm512_store_ps(out + 16, _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
    if (C > 2) _mm512_store_ps(out + 32, _mm512_shuffle_f32x4(u2, u3, _MM_SHUFFLE(2, 0, 2, 0)));
    if (C > 3) _mm512_store_ps(out + 48, _mm512_shuffle_f32x4(u2, u3, _MM_SHUFFLE(3, 1, 3, 1)));
}

// 8-bit value weights (the int8 mode): w = p*va >= 0 rounded to uint8 per (tile,
// head) against max w, and each dword lane holds the codes of tokens t..t+3 for one
// channel as four bytes (load_code_quads, then shift 2k + mask for channel 4b+k), so
// vpdpbusd (weights unsigned, codes signed) does four tokens x 16 channels per
// instruction with exact int32 sums (<= 4*3*255 per quad). The result is formed with
// centred codes as in the int16 path.
template <int NH, int C, int Q>
inline void values_chunk_v2_int8(const uint8_t* vcodes, size_t row_bytes, int D, int G, int d0, const uint8_t* w8,
                                 const int32_t* w8_sum, const float* wscale, const float* wsum, float* tmp,
                                 Prefetcher& pf)
{
    const __m512i permute = quad_permute<Q>(row_bytes);
    __m512i a[NH][4];
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < 4; ++k) a[h][k] = _mm512_setzero_si512();
    const __m512i m = _mm512_set1_epi32(0x03030303);
    const uint8_t* p = vcodes + d0 / 4;
    for (int t = 0; t < G; t += 4, p += 4 * row_bytes) {
        pf.step();
        pf.step();
        const __m512i quads = load_code_quads<C, Q>(p, row_bytes, permute);
        __m512i x[4];
        x[0] = _mm512_and_si512(quads, m);
        x[1] = _mm512_and_si512(_mm512_srli_epi32(quads, 2), m);
        x[2] = _mm512_and_si512(_mm512_srli_epi32(quads, 4), m);
        x[3] = _mm512_and_si512(_mm512_srli_epi32(quads, 6), m);
        for (int h = 0; h < NH; ++h) {
            int32_t wq;
            memcpy(&wq, w8 + h * G + t, 4);
            const __m512i wb = _mm512_set1_epi32(wq);
            for (int k = 0; k < 4; ++k) a[h][k] = dpbusd(a[h][k], wb, x[k]);
        }
    }
    for (int h = 0; h < NH; ++h) store_value_sums<C>(a[h], w8_sum[h], wscale[h], wsum[h], tmp + h * D + d0);
}

// Integer value aggregation for 2-bit values, int16 mode: w = p*va >= 0 rounded
// to int16 per (tile, head) against max w, exact int32 sums of w16 times the codes.
// As load_code_quads gives the codes, the even tokens' code of channel 4b+k sits
// in bits 2k..2k+1 of the two words of dword b, the odd tokens' 8 bits higher, so
// each vpdpwssd does two tokens x 16 channels. Masked in place (no shift: every extra
// operation takes a slot on the ports the vpdpwssd issue on, the loop's bound), a code is
// c 4^k, and S = sum_t w16 c 4^k stays exact in int32 (<= 128 * 32767 * 192 < 2^31):
// S >> 2k is the sum. The weights are stored in quad order (t0, t2, t1, t3) to
// pair with the even and odd words. The result is formed with centred codes
// y = 2c - 3, whose weight-rounding errors mostly cancel where raw codes (mean
// 1.5) would add them up as a bias: sum_t w16 y = 2 sum_t w16 c - 3 W16 exactly in
// int32 (W16 = sum_t w16), and sum_t w c = (wscale sum_t w16 y + 3 wsum) / 2 takes
// the 3 sum w part from the exact float weights (store_value_sums).
template <int NH, int C, bool kVnni, int Q>
inline void values_chunk_v2_int16(const uint8_t* vcodes, size_t row_bytes, int D, int G, int d0, const int16_t* w16,
                                   const int32_t* w16_sum, const float* wscale, const float* wsum, float* tmp,
                                   Prefetcher& pf)
{
    // Without VBMI each code is masked in place (c 4^k, the sum shifted back by 2k); with it, where each word
    // holds one token's byte and nothing else, the masks nest: the low 2, 4 and 6 bits and the whole byte give
    // S0, S0 + 4 S1, S0 + 4 S1 + 16 S2 and S0 + 4 S1 + 16 S2 + 64 S3 (<= 128 * 32767 * 255 < 2^31, exact),
    // which the finish differences: three ands a register instead of four.
    constexpr bool kNested = Q != kQuadsInsert;
    const QuadPairPermutes permute = kNested ? quad_pair_permutes<Q>(row_bytes) : QuadPairPermutes{};
    __m512i a[NH][4];
    for (int h = 0; h < NH; ++h)
        for (int k = 0; k < 4; ++k) a[h][k] = _mm512_setzero_si512();
    const uint8_t* p = vcodes + d0 / 4;
    for (int t = 0; t < G; t += 4, p += 4 * row_bytes) {
        pf.step();
        pf.step();
        __m512i even, odd;
        if constexpr (kNested) {
            load_code_pairs<Q>(p, row_bytes, permute, even, odd);
        } else {
            even = load_code_quads<C, Q>(p, row_bytes, _mm512_setzero_si512());
            odd = _mm512_srli_epi16(even, 8);
        }
        __m512i xe[4], xo[4];
        for (int k = 0; k < 4; ++k) {
            if (kNested && k == 3) {
                xe[k] = even;
                xo[k] = odd;
                continue;
            }
            constexpr uint32_t nested[3] = {0x00030003u, 0x000F000Fu, 0x003F003Fu};
            const __m512i m = _mm512_set1_epi32((int32_t)(kNested ? nested[k] : 0x00030003u << (2 * k)));
            xe[k] = _mm512_and_si512(even, m);
            xo[k] = _mm512_and_si512(odd, m);
        }
        for (int h = 0; h < NH; ++h) {
            int32_t we, wo;
            memcpy(&we, w16 + h * G + t, 4);
            memcpy(&wo, w16 + h * G + t + 2, 4);
            const __m512i be = _mm512_set1_epi32(we), bo = _mm512_set1_epi32(wo);
            for (int k = 0; k < 4; ++k) {
                a[h][k] = dpwssd<kVnni>(a[h][k], xe[k], be);
                a[h][k] = dpwssd<kVnni>(a[h][k], xo[k], bo);
            }
        }
    }
    for (int h = 0; h < NH; ++h) {
        __m512i S[4];
        for (int k = 0; k < 4; ++k)
            S[k] = _mm512_srai_epi32(kNested && k > 0 ? _mm512_sub_epi32(a[h][k], a[h][k - 1]) : a[h][k], 2 * k);
        store_value_sums<C>(S, w16_sum[h], wscale[h], wsum[h], tmp + h * D + d0);
    }
}

// A record's 2-bit value sums in 64-, 32- and 16-channel chunks, each by chunk(C, Q, d0) with its quad form Q:
// with VBMI (kVbmi) the 64-channel chunks of head_dim <= 128 take a byte permute (load_code_quads).
template <bool kVbmi, class Chunk>
inline void value_chunks(int D, Chunk&& chunk)
{
    const size_t row_bytes = (size_t)D / 4;
    int d0 = 0;
    if constexpr (kVbmi) {
        if (row_bytes == 16)
            for (; d0 + 64 <= D; d0 += 64) chunk(std::integral_constant<int, 4>{}, std::integral_constant<int, kQuadsVpermb>{}, d0);
        if (row_bytes <= 32)
            for (; d0 + 64 <= D; d0 += 64) chunk(std::integral_constant<int, 4>{}, std::integral_constant<int, kQuadsVpermt2b>{}, d0);
    }
    for (; d0 + 64 <= D; d0 += 64) chunk(std::integral_constant<int, 4>{}, std::integral_constant<int, kQuadsInsert>{}, d0);
    for (; d0 + 32 <= D; d0 += 32) chunk(std::integral_constant<int, 2>{}, std::integral_constant<int, kQuadsInsert>{}, d0);
    for (; d0 < D; d0 += 16) chunk(std::integral_constant<int, 1>{}, std::integral_constant<int, kQuadsInsert>{}, d0);
}

template <bool kVnni, bool kVbmi>
void values_v2_int16_dispatch(int nh, const uint8_t* vcodes, int D, int G, const int16_t* w16, const int32_t* w16_sum,
                               const float* wscale, const float* wsum, float* tmp, Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        value_chunks<kVbmi>(D, [&](auto c, auto q, int d0) {
            values_chunk_v2_int16<decltype(heads)::value, decltype(c)::value, kVnni, decltype(q)::value>(
                vcodes, (size_t)D / 4, D, G, d0, w16, w16_sum, wscale, wsum, tmp, pf);
        });
    });
}

template <bool kVbmi>
void values_v2_int8_dispatch(int nh, const uint8_t* vcodes, int D, int G, const uint8_t* w8, const int32_t* w8_sum,
                             const float* wscale, const float* wsum, float* tmp, Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        value_chunks<kVbmi>(D, [&](auto c, auto q, int d0) {
            values_chunk_v2_int8<decltype(heads)::value, decltype(c)::value, decltype(q)::value>(
                vcodes, (size_t)D / 4, D, G, d0, w8, w8_sum, wscale, wsum, tmp, pf);
        });
    });
}


template <int KB>
void scores_dispatch(int nh, const uint8_t* kc, int D, int G, const float* qa, float* s, Prefetcher& pf)
{
    if (KB == 4) {
        with_head_count(nh, [&](auto heads) {
            tile_scores_k4<decltype(heads)::value>(kc, D, G, qa, s, pf);
        });
        return;
    }
    with_head_count(nh, [&](auto heads) {
        tile_scores<KB, decltype(heads)::value>(kc, D, G, qa, s, pf);
    });
}

// Run-time switches (VNNI, VBMI) as template arguments: f(std::true_type) or f(std::false_type), and for two.
template <class F>
inline void with_flag(bool on, F&& f)
{
    if (on)
        f(std::true_type{});
    else
        f(std::false_type{});
}
template <class F>
inline void with_flags(bool a, bool b, F&& f)
{
    with_flag(a, [&](auto a_on) { with_flag(b, [&](auto b_on) { f(a_on, b_on); }); });
}

template <bool kVnni, bool kVbmi>
void scores_int16_dispatch(int nh, const uint8_t* kc, int D, const int16_t* qi, const ScoreArgs& a, __m512* smax,
                           Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        constexpr int NH = decltype(heads)::value;
        if (kVbmi && D <= 256)
            tile_scores_k4_int16<NH, kVnni, kScoresVbmi>(kc, D, qi, a, smax, pf);
        else if (D <= 256)
            tile_scores_k4_int16<NH, kVnni, kScoresHighTimes16>(kc, D, qi, a, smax, pf);
        else
            tile_scores_k4_int16<NH, kVnni, kScoresPlain>(kc, D, qi, a, smax, pf);
    });
}

void scores_int8_dispatch(int nh, const uint8_t* kc, int D, const int8_t* qi, const ScoreArgs& a, __m512* smax,
                          Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_scores_k4_int8<decltype(heads)::value>(kc, D, qi, a, smax, pf);
    });
}

template <int VB>
void values_dispatch(int nh, const uint8_t* vcodes, int D, int G, const float* w, float* tmp, Prefetcher& pf)
{
    with_head_count(nh, [&](auto heads) {
        tile_values<VB, decltype(heads)::value>(vcodes, D, G, w, tmp, pf);
    });
}

// Online-softmax bookkeeping for a block whose largest score is block_max: when
// it raises the running max m, l and both accumulators are rescaled by
// exp(m_old - m_new) (exp(-inf) = 0 for the first block); otherwise nothing changes.
inline void softmax_rescale(float block_max, float* m, float* l, float* acc_orig, float* acc_rot, int D)
{
    if (!(block_max > *m)) return;
    const float alpha = expf(*m - block_max);
    *m = block_max;
    if (alpha == 1.0f) return;
    *l *= alpha;
    const __m512 av = _mm512_set1_ps(alpha);
    for (int d = 0; d < D; d += 16) {
        _mm512_storeu_ps(acc_orig + d, _mm512_mul_ps(_mm512_loadu_ps(acc_orig + d), av));
        _mm512_storeu_ps(acc_rot + d, _mm512_mul_ps(_mm512_loadu_ps(acc_rot + d), av));
    }
}

// Online-softmax step for one head over n scores (n % 16 == 0): rescales l and
// both accumulators when the max grows and leaves p = exp(s - m) in s.
inline void softmax_update(float* s, int n, float* m, float* l, float* acc_orig, float* acc_rot, int D)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int t = 0; t < n; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + t));
    softmax_rescale(_mm512_reduce_max_ps(mx), m, l, acc_orig, acc_rot, D);
    const __m512 mv = _mm512_set1_ps(*m);
    __m512 sum = _mm512_setzero_ps();
    for (int t = 0; t < n; t += 16) {
        const __m512 p = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t), mv));
        _mm512_storeu_ps(s + t, p);
        sum = _mm512_add_ps(sum, p);
    }
    *l += _mm512_reduce_add_ps(sum);
}

// The weights of the NH heads of a unit (the online softmax and the value weights): per head,
// the running max and l are updated from the block max smax, p = exp(s - m) is summed into l,
// pz = sum p vz, and the value weights w = p va are written back to s; for the integer value
// path also their max and sum, their rounding to w16 / w8 (against max w) and its exact sum.
// Wherever integer arithmetic is on (integer scores or integer value weights), the cheaper exp
// serves. Each step runs across the heads before the next: a head's pass, reductions, divisions
// and rounding form one dependency chain, and the heads' chains side by side keep the ports
// busy where head after head left them waiting (the same operations per head, so the same
// bits; timings in RESULTS §2, twenty-seventh session).
template <int NH, bool kIntExp, bool kIntWeights>
inline void weights_heads(float* s, int G, const float* va, const float* vz, const __m512* smax, SoftmaxState st,
                          int h0, int D, bool byte_values, bool va_negative, float* pz, float* wsum,
                          float* wscale, int32_t* w_int_sum, int16_t* w16, uint8_t* w8)
{
    const float wmax_int = byte_values ? 255.0f : 32767.0f;  // the int8 mode's uint8 weights, else int16's
    __m512 mv[NH], psum[NH], z[NH], wmx[NH], wsm[NH];
    for (int h = 0; h < NH; ++h) {
        const int hq = h0 + h;
        softmax_rescale(_mm512_reduce_max_ps(smax[h]), st.m + hq, st.l + hq, st.acc_orig + (size_t)hq * D,
                        st.acc_rot + (size_t)hq * D, D);
        mv[h] = _mm512_set1_ps(st.m[hq]);
        psum[h] = z[h] = wmx[h] = wsm[h] = _mm512_setzero_ps();
    }
    for (int t = 0; t < G; t += 16) {
        const __m512 vzt = _mm512_load_ps(vz + t), vat = _mm512_load_ps(va + t);
        for (int h = 0; h < NH; ++h) {
            float* sh = s + h * G;
            const __m512 x = _mm512_sub_ps(_mm512_load_ps(sh + t), mv[h]);
            const __m512 p = kIntExp ? exp_int_mode_ps(x) : exp_ps(x);
            psum[h] = _mm512_add_ps(psum[h], p);
            z[h] = _mm512_fmadd_ps(p, vzt, z[h]);
            const __m512 w = _mm512_mul_ps(p, vat);
            _mm512_store_ps(sh + t, w);
            if (kIntWeights) {
                wmx[h] = _mm512_max_ps(wmx[h], w);
                wsm[h] = _mm512_add_ps(wsm[h], w);
            }
        }
    }
    for (int h = 0; h < NH; ++h) {
        st.l[h0 + h] += _mm512_reduce_add_ps(psum[h]);
        pz[h] = _mm512_reduce_add_ps(z[h]);
    }
    if (!kIntWeights) return;
    __m512 inv[NH];
    for (int h = 0; h < NH; ++h) {
        wsum[h] = _mm512_reduce_add_ps(wsm[h]);
        const float wmax = _mm512_reduce_max_ps(wmx[h]);
        wscale[h] = va_negative ? NAN : wmax > 0.0f ? wmax / wmax_int : 0.0f;
        inv[h] = _mm512_set1_ps(inverse_scale(wmax_int, wmax));
    }
    const __m512i top = _mm512_set1_epi32((int32_t)wmax_int);
    __m512i isum[NH];
    for (int h = 0; h < NH; ++h) isum[h] = _mm512_setzero_si512();
    for (int t = 0; t < G; t += 16)
        for (int h = 0; h < NH; ++h) {
            // min: a product rounded past the top saturates, and the sum must be of what is stored
            const __m512i r = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(s + h * G + t), inv[h])), top);
            isum[h] = _mm512_add_epi32(isum[h], r);
            if (byte_values)
                _mm_store_si128(reinterpret_cast<__m128i*>(w8 + h * G + t), _mm512_cvtepi32_epi8(r));
            else  // quad order t0, t2, t1, t3 (values_chunk_v2_int16)
                _mm256_store_si256(reinterpret_cast<__m256i*>(w16 + h * G + t),
                                   _mm512_cvtepi32_epi16(_mm512_shuffle_epi32(r, _MM_PERM_DBCA)));
        }
    for (int h = 0; h < NH; ++h) w_int_sum[h] = reduce_add_epi32_wrapping(isum[h]);
}

template <int KB, int VB>
void attend_tiles_impl(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record,
                       int64_t n_tiles, int64_t tile_stride, SoftmaxState st)
{
    const int G = fmt.group, D = fmt.head_dim;
    const kvarn_record_layout L = record_layout(fmt);
    const int mode = KB == 4 ? score_mode() : kScoresFloat;
    const bool centred = mode == kScoresInt8;  // the int8 mode scores centred key codes (kCentreCode)
    alignas(64) float ka[KVARN_MAX_HEAD_DIM], kz[KVARN_MAX_HEAD_DIM], kzc[KVARN_MAX_HEAD_DIM], vc[KVARN_MAX_HEAD_DIM];
    alignas(64) float kt[128], va[128], vz[128];
    alignas(64) float qa[kHeadGroup * KVARN_MAX_HEAD_DIM], tmp[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(64) int8_t qi8[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(64) int16_t qi16[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(64) float s[kHeadGroup * 128];
    alignas(64) int16_t w16[kHeadGroup * 128];
    alignas(64) uint8_t w8[kHeadGroup * 128];
    const bool int_values = VB == 2 && score_mode() != kScoresFloat;
    const bool byte_values = int_values && score_mode() == kScoresInt8;  // the int8 mode: 8-bit value weights too
    const bool vnni = avx512_vnni_on();  // int8 (vpdpbusd) runs only then: score_mode() says so
    const bool vbmi = avx512_vbmi_on();  // the value codes' byte permutes (load_code_quads)
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const uint8_t* rec = first_record + tile * tile_stride;
        Prefetcher pf{nullptr, nullptr, 0};
        if (tile + 1 < n_tiles) {
            pf.p = reinterpret_cast<const char*>(rec + tile_stride);
            pf.end = pf.p + L.total;
            pf.ahead = tile + 2 < n_tiles ? tile_stride : 0;
        }
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.ka), ka, D);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.kz), kz, D);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.vc), vc, D);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.kt), kt, G);
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.va), va, G);
        // The int16 value sums assume va >= 0 (as the avx2 file): a negative va gives NaN sums, not wrong ones.
        bool va_negative = false;
        if (int_values)
            for (int t = 0; t < G; t += 16) va_negative |= _mm512_cmp_ps_mask(_mm512_load_ps(va + t), _mm512_setzero_ps(), _CMP_LT_OQ) != 0;
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.vz), vz, G);
        // The int8 mode scores centred codes (kCentreCode): q.kz' here, the rest after the rounding.
        if (centred) centred_zero_points(ka, kz, kzc, D);
        const float* kz_scored = centred ? kzc : kz;
        for (int h0 = 0; h0 < n_q; h0 += kHeadGroup) {
            const int nh = n_q - h0 < kHeadGroup ? n_q - h0 : kHeadGroup;
            float qz[kHeadGroup], qscale[kHeadGroup];
            for (int h = 0; h < nh; ++h) {
                const float* q = q_rot + (size_t)(h0 + h) * D;
                __m512 z = _mm512_setzero_ps(), amax = _mm512_setzero_ps();
                __mmask16 nan = 0;
                for (int d = 0; d < D; d += 16) {
                    const __m512 qv = _mm512_loadu_ps(q + d);
                    const __m512 a = _mm512_mul_ps(qv, _mm512_load_ps(ka + d));
                    _mm512_store_ps(qa + h * D + d, a);
                    amax = _mm512_max_ps(amax, _mm512_abs_ps(a));
                    if (mode != kScoresFloat) nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
                    z = _mm512_fmadd_ps(qv, _mm512_load_ps(kz_scored + d), z);
                }
                if (!centred) qz[h] = _mm512_reduce_add_ps(z);
                if (mode != kScoresFloat) {
                    // Symmetric: q_int = round(qa * qmax / max|qa|), |q_int| <= qmax (saturating narrow).
                    const float qmax = mode == kScoresInt8 ? 127.0f : 32767.0f;
                    const float mx = _mm512_reduce_max_ps(amax);
                    // A NaN in ka (a corrupt record) would convert to a finite integer: carry it in the scale.
                    // So would an infinite q*ka (an Inf in ka, or a scale that overflows it): inf * 0 is NaN,
                    // which narrows to the most negative integer whatever the sign.
                    qscale[h] = nan || !(mx <= FLT_MAX) ? NAN : mx > 0.0f ? mx / qmax : 0.0f;
                    const __m512 inv = _mm512_set1_ps(inverse_scale(qmax, mx));
                    __m512i qsum = _mm512_setzero_si512();  // int8: sum of q_int (|q_int| <= qmax: no lane saturates)
                    for (int d = 0; d < D; d += 16) {
                        const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(qa + h * D + d), inv));
                        if (centred) {  // the int8 mode
                            qsum = _mm512_add_epi32(qsum, r);
                            _mm_storeu_si128(reinterpret_cast<__m128i*>(qi8 + h * D + d), _mm512_cvtsepi32_epi8(r));
                        } else {
                            _mm256_storeu_si256(reinterpret_cast<__m256i*>(qi16 + h * D + d), _mm512_cvtsepi32_epi16(r));
                        }
                    }
                    if (centred) {  // qz = q.kz' - 7.5 qscale sum q_int = q.kz + 7.5 sum (qa - qscale q_int)
                        z = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(qsum), _mm512_set1_ps(kCentreCode * qscale[h]), z);
                        qz[h] = _mm512_reduce_add_ps(z);
                    }
                }
            }
            __m512 smax[kHeadGroup];
            for (int h = 0; h < nh; ++h) smax[h] = _mm512_set1_ps(-INFINITY);
            const ScoreArgs args{qscale, qz, kt, G, s};
            if (mode == kScoresInt16) {
                with_flags(vnni, vbmi, [&](auto vnni_on, auto vbmi_on) {
                    scores_int16_dispatch<decltype(vnni_on)::value, decltype(vbmi_on)::value>(nh, rec + L.k_codes, D, qi16,
                                                                                              args, smax, pf);
                });
            } else if (mode == kScoresInt8) {
                scores_int8_dispatch(nh, rec + L.k_codes, D, qi8, args, smax, pf);
            } else {
                scores_dispatch<KB>(nh, rec + L.k_codes, D, G, qa, s, pf);
                for (int h = 0; h < nh; ++h) {
                    float* sh = s + h * G;
                    const __m512 qzv = _mm512_set1_ps(qz[h]);
                    for (int t = 0; t < G; t += 16) {
                        const __m512 sv = _mm512_mul_ps(_mm512_load_ps(kt + t), _mm512_add_ps(_mm512_load_ps(sh + t), qzv));
                        _mm512_store_ps(sh + t, sv);
                        smax[h] = _mm512_max_ps(smax[h], sv);
                    }
                }
            }
            float pz[kHeadGroup], wscale[kHeadGroup], wsum[kHeadGroup];
            int32_t w_int_sum[kHeadGroup];
            with_head_count(nh, [&](auto heads) {
                constexpr int NH = decltype(heads)::value;
                auto weights = [&](auto stage) {
                    stage(s, G, va, vz, smax, st, h0, D, byte_values, va_negative, pz, wsum, wscale, w_int_sum, w16, w8);
                };
                if (int_values)
                    weights(weights_heads<NH, true, true>);
                else if (mode != kScoresFloat)
                    weights(weights_heads<NH, true, false>);
                else
                    weights(weights_heads<NH, false, false>);
            });
            if (byte_values)
                with_flag(vbmi, [&](auto vbmi_on) {
                    values_v2_int8_dispatch<decltype(vbmi_on)::value>(nh, rec + L.v_codes, D, G, w8, w_int_sum, wscale,
                                                                      wsum, tmp, pf);
                });
            else if (int_values)
                with_flags(vnni, vbmi, [&](auto vnni_on, auto vbmi_on) {
                    values_v2_int16_dispatch<decltype(vnni_on)::value, decltype(vbmi_on)::value>(
                        nh, rec + L.v_codes, D, G, w16, w_int_sum, wscale, wsum, tmp, pf);
                });
            else
                values_dispatch<VB>(nh, rec + L.v_codes, D, G, s, tmp, pf);
            for (int h = 0; h < nh; ++h) {
                float* acc = st.acc_rot + (size_t)(h0 + h) * D;
                const __m512 pzv = _mm512_set1_ps(pz[h]);
                for (int d = 0; d < D; d += 16) {
                    const __m512 v = _mm512_mul_ps(_mm512_load_ps(vc + d), _mm512_add_ps(_mm512_load_ps(tmp + h * D + d), pzv));
                    _mm512_storeu_ps(acc + d, _mm512_add_ps(_mm512_loadu_ps(acc + d), v));
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

void attend_tiles_avx512(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record,
                         int64_t n_tiles, int64_t tile_stride, SoftmaxState st)
{
    AttendTilesFn fn = fmt.kbits == 2 ? pick_v<2>(fmt.vbits) : fmt.kbits == 4 ? pick_v<4>(fmt.vbits) : pick_v<8>(fmt.vbits);
    fn(q_rot, n_q, fmt, first_record, n_tiles, tile_stride, st);
}

// ---- attention over full-precision fp16 tokens ---------------------------------------------------
constexpr int kDenseBlock = 64;

// Rows of the next 64-token block (if any) towards L2 while this block computes, a row
// per token: the same kind of software prefetch the quantised kernels get (Prefetcher).
// Only for rows of >= 256 bytes (head_dim >= 128): measured on Zen 4 with caches cold,
// a decode step at head_dim 128 got 18-20 % faster with it; at head_dim 64 it was no faster
// (A/B: equal at 1K-32K, 5-12 % slower at 128K; a first, noisier run showed 30-55 % slower);
// into L1 (T0) it was slower at both (the block being read already fills L1).
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

// Sixteen dot-product vectors v[0..15] summed horizontally at once: lane L of
// the result is the sum of v[L]'s lanes. A transpose-and-add tree (30 shuffles +
// 15 adds for 16 sums) instead of 16 separate reductions (~8 instructions each).
inline __m512 sum16(const __m512 (&v)[16])
{
    __m512 w[8], x[4];
    for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
        w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int j = 0; j < 4; ++j) {  // per 128-bit lane: partial sums of v[4j..4j+3]
        const __m512d a = _mm512_castps_pd(w[2 * j]), b = _mm512_castps_pd(w[2 * j + 1]);
        x[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x44), _mm512_shuffle_f32x4(x[0], x[1], 0xEE));
    const __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x44), _mm512_shuffle_f32x4(x[2], x[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y0, y1, 0x88), _mm512_shuffle_f32x4(y0, y1, 0xDD));
}

// Scores of nb fp16 keys for NH heads; pf brings the next block's keys.
template <int NH>
void dense_scores(const float* q, int D, const uint16_t* k, int64_t nb, int64_t rs, float* s, const RowPrefetch& pf)
{
    int64_t t = 0;
    // 4 tokens x NH heads of dot products per pass, reduced together by sum16:
    // v[4h + i] is (head h, token i), so 128-bit lane h holds head h's 4 scores.
    for (; t + 4 <= nb; t += 4) {
        __m512 v[16];
        for (int i = 0; i < 16; ++i) v[i] = _mm512_setzero_ps();
        for (int i = 0; i < 4; ++i) pf.row(t + i);
        for (int d = 0; d < D; d += 16) {
            __m512 x[4];
            for (int i = 0; i < 4; ++i)
                x[i] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + (t + i) * rs + d)));
            for (int h = 0; h < NH; ++h) {
                const __m512 qv = _mm512_loadu_ps(q + h * D + d);
                for (int i = 0; i < 4; ++i) v[4 * h + i] = _mm512_fmadd_ps(qv, x[i], v[4 * h + i]);
            }
        }
        alignas(64) float r[16];
        _mm512_store_ps(r, sum16(v));
        for (int h = 0; h < NH; ++h) _mm_storeu_ps(s + h * kDenseBlock + t, _mm_load_ps(r + 4 * h));
    }
    for (; t < nb; ++t) {
        pf.row(t);
        const uint16_t* k0 = k + t * rs;
        __m512 a0[NH];
        for (int h = 0; h < NH; ++h) a0[h] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            const __m512 x0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k0 + d)));
            for (int h = 0; h < NH; ++h) a0[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * D + d), x0, a0[h]);
        }
        for (int h = 0; h < NH; ++h) s[h * kDenseBlock + t] = _mm512_reduce_add_ps(a0[h]);
    }
}

template <int NH, int C>
inline void dense_values_chunk(const float* p, const uint16_t* v, int64_t nb, int64_t rs, int d0, float* const* acc,
                               const RowPrefetch& pf)
{
    __m512 a[NH][C];
    for (int h = 0; h < NH; ++h)
        for (int c = 0; c < C; ++c) a[h][c] = _mm512_loadu_ps(acc[h] + d0 + 16 * c);
    const uint16_t* vr = v + d0;
    for (int64_t t = 0; t < nb; ++t, vr += rs) {
        if (d0 == 0) pf.row(t);
        __m512 x[C];
        for (int c = 0; c < C; ++c) x[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + 16 * c)));
        for (int h = 0; h < NH; ++h) {
            const __m512 pb = _mm512_set1_ps(p[h * kDenseBlock + t]);
            for (int c = 0; c < C; ++c) a[h][c] = _mm512_fmadd_ps(pb, x[c], a[h][c]);
        }
    }
    for (int h = 0; h < NH; ++h)
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc[h] + d0 + 16 * c, a[h][c]);
}

template <int NH>
void dense_values(const float* p, int D, const uint16_t* v, int64_t nb, int64_t rs, float* const* acc,
                  const RowPrefetch& pf)
{
    int d0 = 0;
    for (; d0 + 64 <= D; d0 += 64) dense_values_chunk<NH, 4>(p, v, nb, rs, d0, acc, pf);
    for (; d0 + 32 <= D; d0 += 32) dense_values_chunk<NH, 2>(p, v, nb, rs, d0, acc, pf);
    for (; d0 < D; d0 += 16) dense_values_chunk<NH, 1>(p, v, nb, rs, d0, acc, pf);
}

void attend_dense_f16_avx512(const float* q_all, int n_q, int D, const uint16_t* k, const uint16_t* v, int64_t n,
                             int64_t row_stride, SoftmaxState st)
{
    alignas(64) float s[kHeadGroup * kDenseBlock];
    for (int64_t t0 = 0; t0 < n; t0 += kDenseBlock) {
        const int64_t nb = n - t0 < kDenseBlock ? n - t0 : kDenseBlock;
        const int64_t padded = (nb + 15) & ~int64_t(15);
        const uint16_t* kb = k + t0 * row_stride;
        const uint16_t* vb = v + t0 * row_stride;
        const int64_t next_rows = n - t0 - nb < kDenseBlock ? n - t0 - nb : kDenseBlock;
        for (int h0 = 0; h0 < n_q; h0 += kHeadGroup) {
            const int nh = n_q - h0 < kHeadGroup ? n_q - h0 : kHeadGroup;
            const float* q = q_all + (size_t)h0 * D;
            // The first head group brings the next block; later ones find this block in cache.
            RowPrefetch pk, pv;
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
                for (int64_t t = nb; t < padded; ++t) sh[t] = -INFINITY;  // exp gives 0 there
                softmax_update(sh, (int)padded, st.m + hq, st.l + hq, st.acc_orig + (size_t)hq * D,
                               st.acc_rot + (size_t)hq * D, D);
                acc[h] = st.acc_orig + (size_t)hq * D;
            }
            with_head_count(nh, [&](auto heads) {
                dense_values<decltype(heads)::value>(s, D, vb, nb, row_stride, acc, pv);
            });
        }
    }
}

// ---- quantiser (quantize_simd.inc, compiled here with this file's flags) ----
#define KVARN_SIMD_HADAMARD hadamard_rows_avx512
#include "quantize_simd.inc"
#undef KVARN_SIMD_HADAMARD

const KernelTable kAvx512 = {
    "avx512", hadamard_f32_avx512, quantize_tile_simd, attend_tiles_avx512, attend_dense_f16_avx512, to_float_simd,
};

}  // namespace

const KernelTable* avx512_kernels() { return &kAvx512; }

}  // namespace kvarn
