// Twentieth session: the avx2 int16 2-bit value loop (as tile_values_v2_int16<4, false>, without the prefetch)
// against 8-bit weights with vpmaddubsw (u8: the patch's loop; u8b1/u8b2: variants), one tile of G 128 x D 128,
// 4 heads; each checked exact against an integer reference first. Output: zen3_s60_w8_values_loop.log.
// int16 value loop (current) vs a u8-weight maddubs loop, G 128, D 128, 4 heads, one tile each call.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <chrono>
#include <vector>
#include <random>
static inline __m256i dp(__m256i acc, __m256i a, __m256i b) {
    const __m256i prod = _mm256_madd_epi16(a, b);
    asm("vpaddd %1, %0, %0" : "+x"(acc) : "x"(prod));
    return acc;
}
__attribute__((noinline)) void run16(const uint8_t* vc, const int16_t* w16, int32_t* out, int G, int D) {
    const size_t row_bytes = D / 4;
    const __m256i sh01 = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), sh23 = _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6);
    const __m256i m = _mm256_set1_epi32(0x00030003);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256i a0[4], a1[4];
        _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) a0[h] = a1[h] = _mm256_setzero_si256();
        const uint8_t* p = vc + d0 / 4;
        for (int t = 0; t < G; t += 2, p += 2 * row_bytes) {
            int32_t r0, r1; memcpy(&r0, p, 4); memcpy(&r1, p + row_bytes, 4);
            const __m128i y = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(r0), _mm_cvtsi32_si128(r1)));
            const __m256i yb = _mm256_broadcastsi128_si256(y);
            const __m256i x0 = _mm256_and_si256(_mm256_srlv_epi32(yb, sh01), m);
            const __m256i x1 = _mm256_and_si256(_mm256_srlv_epi32(yb, sh23), m);
            _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) {
                int32_t wp; memcpy(&wp, w16 + h * G + t, 4);
                const __m256i wb = _mm256_set1_epi32(wp);
                a0[h] = dp(a0[h], x0, wb);
                a1[h] = dp(a1[h], x1, wb);
            }
        }
        _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) {
            // a0: channels 0 4 8 12 | 1 5 9 13 ; a1: 2 6 10 14 | 3 7 11 15
            __m256 f0 = _mm256_castsi256_ps(a0[h]), f1 = _mm256_castsi256_ps(a1[h]);
            const __m256 lo = _mm256_unpacklo_ps(f0, f1), hi = _mm256_unpackhi_ps(f0, f1);
            _mm256_storeu_si256((__m256i*)(out + h * D + d0), _mm256_castps_si256(_mm256_permutevar8x32_ps(lo, order)));
            _mm256_storeu_si256((__m256i*)(out + h * D + d0 + 8), _mm256_castps_si256(_mm256_permutevar8x32_ps(hi, order)));
        }
    }
}
// w8x2: per head, per token pair t/2: uint32 = (w_t, w_t+1, w_t, w_t+1) bytes.
__attribute__((noinline)) void run8(const uint8_t* vc, const uint32_t* w8x2, int32_t* out, int G, int D) {
    const size_t row_bytes = D / 4;
    const __m256i sh = _mm256_setr_epi64x(0, 2, 4, 6);
    const __m256i m = _mm256_set1_epi8(3);
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256i a0[4], a1[4];
        _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) a0[h] = a1[h] = _mm256_setzero_si256();
        const uint8_t* p = vc + d0 / 4;
        for (int tb = 0; tb < G; tb += 32) {
            __m256i s16[4];
            _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) s16[h] = _mm256_setzero_si256();
            _Pragma("GCC unroll 2") for (int t = tb; t < tb + 32; t += 2, p += 2 * row_bytes) {
                int32_t r0, r1; memcpy(&r0, p, 4); memcpy(&r1, p + row_bytes, 4);
                const __m128i u = _mm_unpacklo_epi8(_mm_cvtsi32_si128(r0), _mm_cvtsi32_si128(r1));
                const __m256i x = _mm256_and_si256(_mm256_srlv_epi64(_mm256_broadcastq_epi64(u), sh), m);
                // qword k, word b: channel 4b+k of tokens t, t+1
                _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) {
                    const __m256i wb = _mm256_set1_epi32((int)w8x2[h * (G / 2) + t / 2]);
                    s16[h] = _mm256_add_epi16(s16[h], _mm256_maddubs_epi16(wb, x));
                }
            }
            const __m256i z = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) {
                a0[h] = _mm256_add_epi32(a0[h], _mm256_unpacklo_epi16(s16[h], z));
                a1[h] = _mm256_add_epi32(a1[h], _mm256_unpackhi_epi16(s16[h], z));
            }
        }
        _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) {
            // s16 words: lane0 = qword0 (ch 0,4,8,12) qword1 (1,5,9,13); lane1 = qword2 (2,6,10,14) qword3 (3,7,11,15)
            // a0 (unpacklo per lane): lane0 words 0-3 = ch 0 4 8 12, lane1 = ch 2 6 10 14; a1: 1 5 9 13 | 3 7 11 15
            alignas(32) int32_t t0[8], t1[8];
            _mm256_store_si256((__m256i*)t0, a0[h]); _mm256_store_si256((__m256i*)t1, a1[h]);
            for (int b = 0; b < 4; ++b) {
                out[h * D + d0 + 4 * b + 0] = t0[b];
                out[h * D + d0 + 4 * b + 2] = t0[4 + b];
                out[h * D + d0 + 4 * b + 1] = t1[b];
                out[h * D + d0 + 4 * b + 3] = t1[4 + b];
            }
        }
    }
}

template <int NC>  // NC code vectors (16 channels each) per step
__attribute__((noinline)) void run8b(const uint8_t* vc, const uint32_t* w8x2, int32_t* out, int G, int D) {
    const size_t row_bytes = D / 4, hs = G / 2;
    const __m256i sh = _mm256_setr_epi64x(0, 2, 4, 6);
    const __m256i m = _mm256_set1_epi8(3);
    for (int d0 = 0; d0 < D; d0 += 16 * NC) {
        alignas(32) int32_t acc[4][NC][2][8] = {};
        for (int tb = 0; tb < G; tb += 32) {
            __m256i s16[4][NC];
            _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) _Pragma("GCC unroll 8") for (int c = 0; c < NC; ++c) s16[h][c] = _mm256_setzero_si256();
            const uint8_t* p = vc + d0 / 4 + (size_t)tb * row_bytes;
            const uint32_t* w = w8x2 + tb / 2;
            for (int i = 0; i < 16; ++i, p += 2 * row_bytes, ++w) {
                __m256i x[NC];
                _Pragma("GCC unroll 8") for (int c = 0; c < NC; ++c) {
                    int32_t r0, r1; memcpy(&r0, p + 4 * c, 4); memcpy(&r1, p + row_bytes + 4 * c, 4);
                    const __m128i u = _mm_unpacklo_epi8(_mm_cvtsi32_si128(r0), _mm_cvtsi32_si128(r1));
                    x[c] = _mm256_and_si256(_mm256_srlv_epi64(_mm256_broadcastq_epi64(u), sh), m);
                }
                _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) {
                    const __m256i wb = _mm256_set1_epi32((int)w[h * hs]);
                    _Pragma("GCC unroll 8") for (int c = 0; c < NC; ++c) s16[h][c] = _mm256_add_epi16(s16[h][c], _mm256_maddubs_epi16(wb, x[c]));
                }
            }
            const __m256i z = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) _Pragma("GCC unroll 8") for (int c = 0; c < NC; ++c) {
                __m256i* a = (__m256i*)acc[h][c];
                _mm256_store_si256(a, _mm256_add_epi32(_mm256_load_si256(a), _mm256_unpacklo_epi16(s16[h][c], z)));
                _mm256_store_si256(a + 1, _mm256_add_epi32(_mm256_load_si256(a + 1), _mm256_unpackhi_epi16(s16[h][c], z)));
            }
        }
        for (int h = 0; h < 4; ++h) for (int c = 0; c < NC; ++c) {
            const int32_t* t0 = acc[h][c][0], *t1 = acc[h][c][1];
            int32_t* o = out + h * D + d0 + 16 * c;
            for (int b = 0; b < 4; ++b) { o[4*b] = t0[b]; o[4*b+2] = t0[4+b]; o[4*b+1] = t1[b]; o[4*b+3] = t1[4+b]; }
        }
    }
}
int main() {
    const int G = 128, D = 128, T = 64;
    std::mt19937 rng(1);
    std::vector<uint8_t> vc(T * G * D / 4); for (auto& x : vc) x = rng();
    std::vector<int16_t> w16(4 * G); std::vector<uint32_t> w8(4 * G / 2);
    _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) for (int t = 0; t < G; ++t) w16[h * G + t] = rng() % 256;
    _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) for (int t = 0; t < G; t += 2) { uint32_t a = (uint16_t)w16[h*G+t], b = (uint16_t)w16[h*G+t+1]; w8[h*G/2+t/2] = a | b << 8 | a << 16 | b << 24; }
    std::vector<int32_t> o16(4 * D), o8(4 * D), ref(4*D);
    _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) for (int d = 0; d < D; ++d) { int64_t s = 0; for (int t = 0; t < G; ++t) s += w16[h*G+t] * ((vc[t*D/4 + d/4] >> (2*(d%4))) & 3); ref[h*D+d] = s; }
    run16(vc.data(), w16.data(), o16.data(), G, D); run8(vc.data(), w8.data(), o8.data(), G, D);
    printf("int16 matches ref: %d, u8 matches ref: %d\n", o16 == ref, o8 == ref);
    run8b<1>(vc.data(), w8.data(), o8.data(), G, D); printf("b1 %d\n", o8 == ref); run8b<2>(vc.data(), w8.data(), o8.data(), G, D); printf("b2 %d\n", o8 == ref);
    for (int rep = 0; rep < 4; ++rep)
    for (int v = 0; v < 4; ++v) {
        double best = 1e9;
        for (int r = 0; r < 200; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < T; ++i) {
                const uint8_t* tile = vc.data() + (size_t)i * G * D / 4;
                if (v == 0) run16(tile, w16.data(), o16.data(), G, D); else if (v == 1) run8(tile, w8.data(), o8.data(), G, D); else if (v == 2) run8b<1>(tile, w8.data(), o8.data(), G, D); else run8b<2>(tile, w8.data(), o8.data(), G, D);
            }
            double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / T;
            if (dt < best) best = dt;
        }
        printf("%-6s %.3f us/tile\n", v == 0 ? "int16" : v == 1 ? "u8" : v == 2 ? "u8b1" : "u8b2", best * 1e6);
    }
}
