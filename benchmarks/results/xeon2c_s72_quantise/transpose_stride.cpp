#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstring>
inline void transpose8(const float* src, size_t ss, float* dst, size_t ds)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ss);
    for (int i = 0; i < 4; ++i) { t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]); t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]); }
    for (int i = 0; i < 2; ++i) {
        r[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) { _mm256_storeu_ps(dst + i * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20)); _mm256_storeu_ps(dst + (i + 4) * ds, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31)); }
}
__attribute__((noinline)) void transpose_8(const float* src, int R, int C, float* dst, int ds)
{
    for (int i = 0; i < R; i += 8) for (int j = 0; j < C; j += 8) transpose8(src + (size_t)i * C + j, C, dst + (size_t)j * ds + i, ds);
}
__attribute__((noinline)) void transpose_8c(const float* src, int R, int C, float* dst, int ds)
{
    for (int j = 0; j < C; j += 8) for (int i = 0; i < R; i += 8) transpose8(src + (size_t)i * C + j, C, dst + (size_t)j * ds + i, ds);
}
// 16x16: rows r[0..15] -> columns
inline void transpose16(const float* src, size_t ss, float* dst, size_t ds)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ss);
    // within 128-bit lanes: 4x4 transposes of rows (4k..4k+3), as the 8x8 code does
    for (int i = 0; i < 8; ++i) { t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]); t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]); }
    for (int i = 0; i < 4; ++i) {
        r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    // now r[4k+m] holds, in 128-bit lane L, column 4L+m of rows 4k..4k+3.
    // combine across groups: t[m + 4*?]
    for (int m = 0; m < 4; ++m) {
        // rows 0-3 (r[m]) and 4-7 (r[4+m]): lanes (0,2) / (1,3) interleaved pairs
        t[m]      = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);   // lanes: r[m].0, r[m].2, r[4+m].0, r[4+m].2
        t[4 + m]  = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);   // r[m].1, r[m].3, r[4+m].1, r[4+m].3
        t[8 + m]  = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
        t[12 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
    }
    for (int m = 0; m < 4; ++m) {
        // column 4L+m over all 16 rows: need lane L of r[m] (rows0-3), r[4+m] (4-7), r[8+m], r[12+m]
        // t[m] = [c m of rows0-3 (L0), c 8+m rows0-3 (L2), c m rows4-7, c 8+m rows 4-7]
        r[m]      = _mm512_shuffle_f32x4(t[m], t[8 + m], 0x88);   // [c m r0-3, c m r4-7, c m r8-11, c m r12-15] -> column m
        r[8 + m]  = _mm512_shuffle_f32x4(t[m], t[8 + m], 0xDD);   // column 8+m
        r[4 + m]  = _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0x88);  // column 4+m
        r[12 + m] = _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0xDD);  // column 12+m
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ds, r[i]);
}
__attribute__((noinline)) void transpose_16(const float* src, int R, int C, float* dst, int ds)
{
    for (int i = 0; i < R; i += 16) for (int j = 0; j < C; j += 16) transpose16(src + (size_t)i * C + j, C, dst + (size_t)j * ds + i, ds);
}
int main() {
  for (auto rc : {std::pair<int,int>{128,128}, {128,64}, {64,128}, {128,256}}) {
    int R = rc.first, C = rc.second;
    std::vector<float> a(R*C), b((R+32)*C), c((R+32)*C);
    for (int i = 0; i < R*C; ++i) a[i] = (float)i;
    auto bench = [&](auto f) { double best = 1e9; for (int rep = 0; rep < 3000; ++rep) { auto t0 = std::chrono::steady_clock::now(); f(); auto t1 = std::chrono::steady_clock::now(); best = std::min(best, std::chrono::duration<double, std::nano>(t1-t0).count()); } return best; };
    for (int pad : {0, 16}) {
      int ds = R + pad;
      bool ok = true;
      transpose_8(a.data(), R, C, b.data(), ds); transpose_16(a.data(), R, C, c.data(), ds);
      for (int i = 0; i < R; ++i) for (int j = 0; j < C; ++j) ok &= b[(size_t)j*ds+i] == a[(size_t)i*C+j] && c[(size_t)j*ds+i] == a[(size_t)i*C+j];
      transpose_8c(a.data(), R, C, b.data(), ds);
      for (int i = 0; i < R; ++i) for (int j = 0; j < C; ++j) ok &= b[(size_t)j*ds+i] == a[(size_t)i*C+j];
      double t8 = bench([&]{ transpose_8(a.data(), R, C, b.data(), ds); });
      double t8c = bench([&]{ transpose_8c(a.data(), R, C, b.data(), ds); });
      double t16 = bench([&]{ transpose_16(a.data(), R, C, c.data(), ds); });
      printf("%dx%d dst stride %d (%s): 8x8 %.0f ns, 8x8 column-major order %.0f ns, 16x16 %.0f ns\n", R, C, ds, ok ? "ok" : "WRONG", t8, t8c, t16);
    }
  }
}
