// Fifteenth session: the avx2 int16 2-bit value loop (tile_values_v2_int16<4, false>, its inner step
// copied without the prefetch) for one tile (G 128, D 128, 4 query heads), and three variants that drop
// a part of it: no code unpacking (constant codes), unpacking only, constant weights (no broadcasts).
// g++ -O2 -mavx2 -mfma -std=c++17 zen3_s50_values_loop.cpp && taskset -c 0 ./a.out
// Output: zen3_s50_values_loop.log.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <chrono>
#include <vector>
static inline __m256i dp(__m256i acc, __m256i a, __m256i b) {
    const __m256i prod = _mm256_madd_epi16(a, b);
    asm("vpaddd %1, %0, %0" : "+x"(acc) : "x"(prod));
    return acc;
}
template <int V>
__attribute__((noinline)) void run(const uint8_t* vc, const int16_t* w16, int32_t* out, int G, int D) {
    const size_t row_bytes = D / 4;
    const __m256i sh01 = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), sh23 = _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6);
    const __m256i m = _mm256_set1_epi32(0x00030003);
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m256i a0[4], a1[4];
        _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) a0[h] = a1[h] = _mm256_setzero_si256();
        const uint8_t* p = vc + d0 / 4;
        __m256i x0 = _mm256_set1_epi32(1), x1 = _mm256_set1_epi32(2);
        for (int t = 0; t < G; t += 2, p += 2 * row_bytes) {
            if (V != 1) {
                int32_t r0, r1; memcpy(&r0, p, 4); memcpy(&r1, p + row_bytes, 4);
                const __m128i y = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(r0), _mm_cvtsi32_si128(r1)));
                const __m256i yb = _mm256_broadcastsi128_si256(y);
                x0 = _mm256_and_si256(_mm256_srlv_epi32(yb, sh01), m);
                x1 = _mm256_and_si256(_mm256_srlv_epi32(yb, sh23), m);
            }
            if (V == 2) { asm volatile("" : "+x"(x0), "+x"(x1)); continue; }
            _Pragma("GCC unroll 8") for (int h = 0; h < 4; ++h) {
                __m256i wb;
                if (V == 3) wb = _mm256_set1_epi32(h + 1);
                else { int32_t wp; memcpy(&wp, w16 + h * G + t, 4); wb = _mm256_set1_epi32(wp); }
                a0[h] = dp(a0[h], x0, wb);
                a1[h] = dp(a1[h], x1, wb);
            }
        }
        for (int h = 0; h < 4; ++h) { _mm256_storeu_si256((__m256i*)(out + h * D + d0), a0[h]); _mm256_storeu_si256((__m256i*)(out + h * D + d0 + 8), a1[h]); }
    }
}
int main() {
    const int G = 128, D = 128, T = 64;
    std::vector<uint8_t> vc(T * G * D / 4, 0x5a); std::vector<int16_t> w(4 * G, 3); std::vector<int32_t> out(4 * D);
    const char* names[] = {"full", "no prep", "prep only", "const weights"};
    for (int rep = 0; rep < 2; ++rep)
    for (int v = 0; v < 4; ++v) {
        double best = 1e9;
        for (int r = 0; r < 50; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < T; ++i) {
                const uint8_t* tile = vc.data() + (size_t)i * G * D / 4;
                if (v == 0) run<0>(tile, w.data(), out.data(), G, D);
                if (v == 1) run<1>(tile, w.data(), out.data(), G, D);
                if (v == 2) run<2>(tile, w.data(), out.data(), G, D);
                if (v == 3) run<3>(tile, w.data(), out.data(), G, D);
            }
            double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / T;
            if (dt < best) best = dt;
        }
        printf("%-14s %.3f us/tile  %.2f ns/step\n", names[v], best * 1e6, best * 1e9 / 512);
    }
}
