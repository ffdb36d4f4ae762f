// avx2 kernels. Assumes AVX2 + FMA + F16C (dispatch checks cpuid and XGETBV
// before this table is ever used). Built with -mavx2 -mfma -mf16c
// -ffp-contract=off: only this file gets those flags.
//
// What each kernel must match (tests/test_simd.py checks all of it):
// - hadamard_f32: bit-identical to scalar (same butterflies, same pairing, the
//   same final multiply by 1/sqrt(block)).
// - quantize_tile: codes and fp16 vectors identical to scalar (see the
//   quantiser section below: the scalar's float products and double sums in
//   the same order, libm expf/logf for the scales, exact divisions for RTN).
// - attend_tiles / attend_dense_f16: scalar's maths reassociated (fp32 FMA,
//   blocked sums, polynomial exp with <= 2 ulp error); ~1e-6 relative.
//
// Link hygiene: nothing here instantiates a header template or inline function
// that another translation unit could also emit (no <algorithm>, no std::vector,
// no <cmath> wrappers): the linker could otherwise keep this file's AVX2 copy
// for the scalar code's use. Everything is in an anonymous namespace.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvarn/kernels.h"

namespace kvarn {
namespace {

// Pulls the next record towards L1 while this one is being worked on: records
// of one head are a whole cache row apart, beyond the reach of the stride prefetcher.
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

// Four horizontal sums at once: lane i of the result is the sum of a_i.
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    __m256 s = _mm256_hadd_ps(s01, s23);
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// exp(x) for x <= 0 (softmax): Cephes-style range reduction x = n ln2 + r,
// |r| <= ln2/2, degree-6 polynomial, 2^n by exponent arithmetic. Measured max
// relative error vs double exp on [-87, 0]: < 2.5e-7 (about 2 ulp). Below
// -87.3 (where exp < FLT_MIN) returns 0.
inline __m256 exp_ps(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3365447505531f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
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

// ---- Hadamard ----------------------------------------------------------------------
// Stages h = 1, 2, 4 inside a vector: y = x with partners swapped; lanes whose
// index has bit h clear take x + y (= a + b), the others y - x (= a - b), the
// same two operands the scalar butterfly adds/subtracts, so results are identical.
inline __m256 fwht8(__m256 x)
{
    __m256 y = _mm256_permute_ps(x, 0xB1);  // 1 0 3 2
    x = _mm256_blend_ps(_mm256_add_ps(x, y), _mm256_sub_ps(y, x), 0xAA);
    y = _mm256_permute_ps(x, 0x4E);  // 2 3 0 1
    x = _mm256_blend_ps(_mm256_add_ps(x, y), _mm256_sub_ps(y, x), 0xCC);
    y = _mm256_permute2f128_ps(x, x, 0x01);
    return _mm256_blend_ps(_mm256_add_ps(x, y), _mm256_sub_ps(y, x), 0xF0);
}

void hadamard_f32_avx2(float* x, int64_t rows, int head_dim)
{
    const int block = kvarn_hadamard_block(head_dim);  // >= 16: head_dim % 16 == 0
    const __m256 norm = _mm256_set1_ps((float)(1.0 / sqrt((double)block)));
    for (int64_t r = 0; r < rows; ++r) {
        float* row = x + r * head_dim;
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
    switch (nh) {
        case 1: tile_scores<KB, 1>(kc, D, G, qa, s, pf); break;
        case 2: tile_scores<KB, 2>(kc, D, G, qa, s, pf); break;
        case 3: tile_scores<KB, 3>(kc, D, G, qa, s, pf); break;
        default: tile_scores<KB, 4>(kc, D, G, qa, s, pf); break;
    }
}

template <int VB>
void values_dispatch(int nh, const uint8_t* vcodes, int D, int G, const float* w, float* tmp, Prefetcher& pf)
{
    switch (nh) {
        case 1: tile_values<VB, 1>(vcodes, D, G, w, tmp, pf); break;
        case 2: tile_values<VB, 2>(vcodes, D, G, w, tmp, pf); break;
        case 3: tile_values<VB, 3>(vcodes, D, G, w, tmp, pf); break;
        default: tile_values<VB, 4>(vcodes, D, G, w, tmp, pf); break;
    }
}

constexpr int kHeadGroup = 4;  // query heads sharing one pass over a tile's codes

// Online-softmax step for one head over n scores (n % 8 == 0): rescales l and
// both accumulators when the max grows, leaves p = exp(s - m) in s, returns nothing.
inline void softmax_update(float* s, int n, float* m, float* l, float* acc_orig, float* acc_rot, int D)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int t = 0; t < n; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + t));
    const float block_max = hmax(mx);
    const float m_new = *m > block_max ? *m : block_max;
    const float alpha = expf(*m - m_new);
    if (alpha != 1.0f) {
        *l *= alpha;
        const __m256 av = _mm256_set1_ps(alpha);
        for (int d = 0; d < D; d += 8) {
            _mm256_storeu_ps(acc_orig + d, _mm256_mul_ps(_mm256_loadu_ps(acc_orig + d), av));
            _mm256_storeu_ps(acc_rot + d, _mm256_mul_ps(_mm256_loadu_ps(acc_rot + d), av));
        }
    }
    const __m256 mv = _mm256_set1_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    for (int t = 0; t < n; t += 8) {
        const __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
        _mm256_storeu_ps(s + t, p);
        sum = _mm256_add_ps(sum, p);
    }
    *l += hsum(sum);
    *m = m_new;
}

template <int KB, int VB>
void attend_tiles_impl(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record,
                       int64_t n_tiles, int64_t tile_stride, SoftmaxState st)
{
    const int G = fmt.group, D = fmt.head_dim;
    const kvarn_record_layout L = fmt.layout();
    alignas(32) float ka[KVARN_MAX_HEAD_DIM], kz[KVARN_MAX_HEAD_DIM], vc[KVARN_MAX_HEAD_DIM];
    alignas(32) float kt[128], va[128], vz[128];
    alignas(32) float qa[kHeadGroup * KVARN_MAX_HEAD_DIM], tmp[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(32) float s[kHeadGroup * 128];
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
        f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.vz), vz, G);
        for (int h0 = 0; h0 < n_q; h0 += kHeadGroup) {
            const int nh = n_q - h0 < kHeadGroup ? n_q - h0 : kHeadGroup;
            float qz[kHeadGroup];
            for (int h = 0; h < nh; ++h) {
                const float* q = q_rot + (size_t)(h0 + h) * D;
                __m256 z = _mm256_setzero_ps();
                for (int d = 0; d < D; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(q + d);
                    _mm256_store_ps(qa + h * D + d, _mm256_mul_ps(qv, _mm256_load_ps(ka + d)));
                    z = _mm256_fmadd_ps(qv, _mm256_load_ps(kz + d), z);
                }
                qz[h] = hsum(z);
            }
            scores_dispatch<KB>(nh, rec + L.k_codes, D, G, qa, s, pf);
            float pz[kHeadGroup];
            for (int h = 0; h < nh; ++h) {
                float* sh = s + h * G;
                const __m256 qzv = _mm256_set1_ps(qz[h]);
                for (int t = 0; t < G; t += 8)
                    _mm256_store_ps(sh + t, _mm256_mul_ps(_mm256_load_ps(kt + t), _mm256_add_ps(_mm256_load_ps(sh + t), qzv)));
                const int hq = h0 + h;
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
template <int NH>
void dense_scores(const float* q, int D, const uint16_t* k, int64_t nb, int64_t rs, float* s)
{
    int64_t t = 0;
    for (; t + 2 <= nb; t += 2) {
        const uint16_t* k0 = k + t * rs;
        const uint16_t* k1 = k0 + rs;
        __m256 a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) a0[h] = a1[h] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k0 + d)));
            const __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k1 + d)));
            for (int h = 0; h < NH; ++h) {
                const __m256 qv = _mm256_loadu_ps(q + h * D + d);
                a0[h] = _mm256_fmadd_ps(qv, x0, a0[h]);
                a1[h] = _mm256_fmadd_ps(qv, x1, a1[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            s[h * kDenseBlock + t] = hsum(a0[h]);
            s[h * kDenseBlock + t + 1] = hsum(a1[h]);
        }
    }
    for (; t < nb; ++t) {
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
void dense_values(const float* p, int D, const uint16_t* v, int64_t nb, int64_t rs, float* const* acc)
{
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256 a0[NH], a1[NH];
        for (int h = 0; h < NH; ++h) {
            a0[h] = _mm256_loadu_ps(acc[h] + d0);
            a1[h] = _mm256_loadu_ps(acc[h] + d0 + 8);
        }
        const uint16_t* vr = v + d0;
        for (int64_t t = 0; t < nb; ++t, vr += rs) {
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
        for (int h0 = 0; h0 < n_q; h0 += kHeadGroup) {
            const int nh = n_q - h0 < kHeadGroup ? n_q - h0 : kHeadGroup;
            const float* q = q_all + (size_t)h0 * D;
            switch (nh) {
                case 1: dense_scores<1>(q, D, kb, nb, row_stride, s); break;
                case 2: dense_scores<2>(q, D, kb, nb, row_stride, s); break;
                case 3: dense_scores<3>(q, D, kb, nb, row_stride, s); break;
                default: dense_scores<4>(q, D, kb, nb, row_stride, s); break;
            }
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
            switch (nh) {
                case 1: dense_values<1>(s, D, vb, nb, row_stride, acc); break;
                case 2: dense_values<2>(s, D, vb, nb, row_stride, acc); break;
                case 3: dense_values<3>(s, D, vb, nb, row_stride, acc); break;
                default: dense_values<4>(s, D, vb, nb, row_stride, acc); break;
            }
        }
    }
}

// ---- quantiser ------------------------------------------------------------------------------
// Mirrors scalar/kernels_scalar.cpp + sinkhorn_scalar.cpp operation for
// operation so the codes and fp16 vectors come out identical:
// - balancing statistics are weighted column statistics (float products, sums
//   and sums of squares in double), vectorised across columns, each lane
//   summing its column in the scalar's row order; row statistics are column
//   statistics of the transposed tile, so they keep that order too;
// - the O(rows + cols) log/exp/clamp steps call the same libm expf/logf;
// - the balanced tile and the codes use exact divisions in the spec's order
//   (x / c[col] / r[row], (x - lo) / scale), round half to even via vroundps.
struct QuantBuffers {
    float* x;     // rows x cols input (K: transposed to channels x tokens)
    float* xT;    // cols x rows: the input transposed, so row statistics are column statistics
    float* rot;   // G x D rotated copy of k or v
    float* row;   // one balanced row
    float* lr; float* lc; float* er; float* ec; float* ir; float* ic; float* cs; float* rs; float* r; float* c;
    double* col_raw; double* row_raw;
    uint8_t* codes;  // one row of byte codes
};

inline float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

// out[j0..j0+NB) = unbiased std over rows i of M[i][j] * w[i] (M is R x C, row-major);
// one pass, sums in double in row order; NB/4 independent chains hide the add latency.
template <int NB>
inline void weighted_column_std_block(const float* M, int R, int C, const float* w, int j0, double* out)
{
    constexpr int K = NB / 4;
    __m256d s[K], q[K];
    for (int k = 0; k < K; ++k) s[k] = q[k] = _mm256_setzero_pd();
    for (int i = 0; i < R; ++i) {
        const float* row = M + (size_t)i * C + j0;
        const __m256 wi = _mm256_set1_ps(w[i]);
        for (int k = 0; k < K; k += 2) {
            const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(row + 4 * k), wi);
            const __m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y)), y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
            s[k] = _mm256_add_pd(s[k], y0);
            s[k + 1] = _mm256_add_pd(s[k + 1], y1);
            q[k] = _mm256_fmadd_pd(y0, y0, q[k]);  // y0*y0 is exact: rounds like the scalar's mul + add
            q[k + 1] = _mm256_fmadd_pd(y1, y1, q[k + 1]);
        }
    }
    const __m256d n = _mm256_set1_pd((double)R), n1 = _mm256_set1_pd((double)(R - 1)), zero = _mm256_setzero_pd();
    for (int k = 0; k < K; ++k) {
        const __m256d mean = _mm256_div_pd(s[k], n);
        const __m256d var = _mm256_div_pd(_mm256_sub_pd(q[k], _mm256_mul_pd(s[k], mean)), n1);
        _mm256_storeu_pd(out + j0 + 4 * k, _mm256_sqrt_pd(_mm256_max_pd(var, zero)));
    }
}

void weighted_column_std(const float* M, int R, int C, const float* w, double* out)
{
    int j0 = 0;
    for (; j0 + 16 <= C; j0 += 16) weighted_column_std_block<16>(M, R, C, w, j0, out);
    for (; j0 < C; j0 += 8) weighted_column_std_block<8>(M, R, C, w, j0, out);
}

// out[i] = (float)(raw[i] * w[i])
void scale_std(const double* raw, const float* w, int n, float* out)
{
    for (int i = 0; i < n; i += 4)
        _mm_storeu_ps(out + i, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(raw + i), _mm256_cvtps_pd(_mm_loadu_ps(w + i)))));
}

inline void transpose8(const float* src, size_t ss, float* dst, size_t ds)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ss);
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        r[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(dst + i * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

// dst (C x R) = transpose of src (R x C); R, C multiples of 8.
void transpose(const float* src, int R, int C, float* dst)
{
    for (int i = 0; i < R; i += 8)
        for (int j = 0; j < C; j += 8) transpose8(src + (size_t)i * C + j, C, dst + (size_t)j * R + i, R);
}

// As scalar's spread: max/min of raw[i] * w[i] in double.
double spread(const double* raw, const float* w, int n)
{
    double lo = raw[0] * w[0], hi = lo;
    for (int i = 1; i < n; ++i) {
        const double s = raw[i] * w[i];
        lo = s < lo ? s : lo;
        hi = s > hi ? s : hi;
    }
    const double eps = KVARN_IMBALANCE_EPS;
    return hi / (lo > eps ? lo : eps);
}

// log_scale += log(clamped std), clamped; returns exp(log_scale) (as scalar's update_log_scale).
inline float update_log_scale(float& log_scale, float std)
{
    log_scale = clampf(log_scale + logf(clampf(std, KVARN_STD_MIN, KVARN_STD_MAX)), KVARN_LOG_SCALE_MIN,
                       KVARN_LOG_SCALE_MAX);
    return expf(log_scale);
}

// X is R x C and xT its transpose (C x R); leaves the best scales in b.r, b.c.
void sinkhorn_balance(const float* X, const float* xT, int R, int C, int iters, QuantBuffers& b)
{
    for (int i = 0; i < R; ++i) { b.lr[i] = 0.0f; b.er[i] = b.ir[i] = b.r[i] = 1.0f; }
    for (int j = 0; j < C; ++j) { b.lc[j] = 0.0f; b.ec[j] = b.ic[j] = b.c[j] = 1.0f; }
    weighted_column_std(X, R, C, b.ir, b.col_raw);
    weighted_column_std(xT, C, R, b.ic, b.row_raw);
    for (int j = 0; j < C; ++j) b.cs[j] = (float)b.col_raw[j];
    double best = spread(b.col_raw, b.ic, C) + spread(b.row_raw, b.ir, R);
    for (int it = 0; it < iters; ++it) {
        for (int j = 0; j < C; ++j) {
            b.ec[j] = update_log_scale(b.lc[j], b.cs[j]);
            b.ic[j] = 1.0f / b.ec[j];
        }
        weighted_column_std(xT, C, R, b.ic, b.row_raw);
        scale_std(b.row_raw, b.ir, R, b.rs);
        for (int i = 0; i < R; ++i) {
            b.er[i] = update_log_scale(b.lr[i], b.rs[i]);
            b.ir[i] = 1.0f / b.er[i];
        }
        weighted_column_std(X, R, C, b.ir, b.col_raw);
        scale_std(b.col_raw, b.ic, C, b.cs);
        const double imbalance = spread(b.col_raw, b.ic, C) + spread(b.row_raw, b.ir, R);
        if (imbalance <= best) {  // ties: the later candidate wins (as scalar)
            best = imbalance;
            memcpy(b.r, b.er, sizeof(float) * R);
            memcpy(b.c, b.ec, sizeof(float) * C);
        }
    }
}

// Packs n byte codes (each < 2^bits) into n*bits/8 bytes, code i at byte i/(8/bits), shift (i%(8/bits))*bits.
void pack_codes(const uint8_t* codes, int n, int bits, uint8_t* out)
{
    if (bits == 8) {
        memcpy(out, codes, (size_t)n);
        return;
    }
    for (int i = 0; i < n; i += 16) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
        if (bits == 4) {
            // pairs: c0 + 16 c1 -> one byte each
            const __m128i w = _mm_maddubs_epi16(x, _mm_set1_epi16(0x1001));
            const __m128i bytes = _mm_packus_epi16(w, w);
            _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 2), bytes);
        } else {
            // quads: (c0 + 4 c1) + 16 (c2 + 4 c3)
            const __m128i w = _mm_madd_epi16(_mm_maddubs_epi16(x, _mm_set1_epi16(0x0401)), _mm_set1_epi32(0x00100001));
            const __m128i h = _mm_packs_epi32(w, w);
            const __m128i bytes = _mm_packus_epi16(h, h);
            const uint32_t v = (uint32_t)_mm_cvtsi128_si32(bytes);
            memcpy(out + i / 4, &v, 4);
        }
    }
}

bool quantize_matrix(const float* X, const float* xT, int R, int C, int bits, int iters, uint8_t* codes, uint16_t* a,
                     uint16_t* z, uint16_t* colscale, QuantBuffers& b)
{
    sinkhorn_balance(X, xT, R, C, iters, b);
    const size_t row_bytes = kvarn_packed_row_bytes(C, bits);
    const float qmax = (float)((1 << bits) - 1);
    const __m256 qmaxv = _mm256_set1_ps(qmax), zero = _mm256_setzero_ps();
    bool finite = true;
    for (int i = 0; i < R; ++i) {
        float* row = b.row;
        const __m256 ri = _mm256_set1_ps(b.r[i]);
        const float* x = X + (size_t)i * C;
        __m256 lo = _mm256_set1_ps(INFINITY), hi = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < C; j += 8) {
            const __m256 v = _mm256_div_ps(_mm256_div_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(b.c + j)), ri);
            _mm256_storeu_ps(row + j, v);
            lo = _mm256_min_ps(lo, v);
            hi = _mm256_max_ps(hi, v);
        }
        // min/max are exact, so the reduction order does not matter.
        __m128 l4 = _mm_min_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
        l4 = _mm_min_ps(l4, _mm_movehl_ps(l4, l4));
        const float lo_s = _mm_cvtss_f32(_mm_min_ss(l4, _mm_movehdup_ps(l4)));
        __m128 h4 = _mm_max_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
        h4 = _mm_max_ps(h4, _mm_movehl_ps(h4, h4));
        const float hi_s = _mm_cvtss_f32(_mm_max_ss(h4, _mm_movehdup_ps(h4)));
        const float sc0 = (hi_s - lo_s) / qmax;
        const float scale = sc0 > KVARN_RTN_SCALE_MIN ? sc0 : KVARN_RTN_SCALE_MIN;
        const __m256 lov = _mm256_set1_ps(lo_s), scv = _mm256_set1_ps(scale);
        for (int j = 0; j < C; j += 8) {
            __m256 c = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j), lov), scv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            c = _mm256_min_ps(_mm256_max_ps(c, zero), qmaxv);
            const __m256i ci = _mm256_cvttps_epi32(c);
            const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(ci), _mm256_extracti128_si256(ci, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(b.codes + j), _mm_packus_epi16(w, w));
        }
        pack_codes(b.codes, C, bits, codes + (size_t)i * row_bytes);
        a[i] = float_to_half(b.r[i] * scale);
        z[i] = float_to_half(b.r[i] * lo_s);
        finite = finite && (a[i] & 0x7c00u) != 0x7c00u && (z[i] & 0x7c00u) != 0x7c00u;
    }
    for (int j = 0; j < C; ++j) {
        colscale[j] = float_to_half(b.c[j]);
        finite = finite && (colscale[j] & 0x7c00u) != 0x7c00u;
    }
    return finite;
}

int quantize_tile_avx2(const float* k, const float* v, const TileFormat& fmt, int iters, uint8_t* record)
{
    const int G = fmt.group, D = fmt.head_dim;
    const size_t n = (size_t)G * D, vec = (size_t)(G > D ? G : D);
    // Plain malloc: no std::vector (see link hygiene above); on failure the
    // scalar kernel takes over (it reports allocation failure by exception).
    // floats: x, xT, rot (n each); 11 float vectors and 2 double vectors (vec each); codes (vec bytes)
    const size_t bytes = (sizeof(float) * (3 * n + 15 * vec) + vec + 63) & ~size_t(63);  // aligned_alloc: multiple of 64
    float* mem = static_cast<float*>(aligned_alloc(64, bytes));
    if (!mem) return scalar_kernels()->quantize_tile(k, v, fmt, iters, record);
    QuantBuffers b;
    b.x = mem; b.xT = b.x + n; b.rot = b.xT + n;
    float* p = b.rot + n;
    b.lr = p; b.lc = p + vec; b.er = p + 2 * vec; b.ec = p + 3 * vec; b.ir = p + 4 * vec; b.ic = p + 5 * vec;
    b.cs = p + 6 * vec; b.rs = p + 7 * vec; b.r = p + 8 * vec; b.c = p + 9 * vec; b.row = p + 10 * vec;
    b.col_raw = reinterpret_cast<double*>(p + 11 * vec);
    b.row_raw = reinterpret_cast<double*>(p + 13 * vec);
    b.codes = reinterpret_cast<uint8_t*>(p + 15 * vec);
    const kvarn_record_layout L = fmt.layout();

    // K: rows = channels, so the rotated G x D tile is the transpose.
    memcpy(b.rot, k, sizeof(float) * n);
    hadamard_f32_avx2(b.rot, G, D);
    transpose(b.rot, G, D, b.x);
    bool ok = quantize_matrix(b.x, b.rot, D, G, fmt.kbits, iters, record + L.k_codes,
                              reinterpret_cast<uint16_t*>(record + L.ka), reinterpret_cast<uint16_t*>(record + L.kz),
                              reinterpret_cast<uint16_t*>(record + L.kt), b);
    // V: rows = tokens.
    memcpy(b.x, v, sizeof(float) * n);
    hadamard_f32_avx2(b.x, G, D);
    transpose(b.x, G, D, b.xT);
    ok = quantize_matrix(b.x, b.xT, G, D, fmt.vbits, iters, record + L.v_codes,
                         reinterpret_cast<uint16_t*>(record + L.va), reinterpret_cast<uint16_t*>(record + L.vz),
                         reinterpret_cast<uint16_t*>(record + L.vc), b) &&
         ok;
    free(mem);
    return ok ? 0 : 1;
}

const KernelTable kAvx2 = {
    "avx2", hadamard_f32_avx2, quantize_tile_avx2, attend_tiles_avx2, attend_dense_f16_avx2,
};

}  // namespace

const KernelTable* avx2_kernels() { return &kAvx2; }

}  // namespace kvarn
