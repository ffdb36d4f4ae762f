#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
// column statistics: lanes = columns, rows summed in order (current kernel's loop)
template <int K>
__attribute__((noinline)) void colpass(const float* M, int R, int C, const float* w, float* out) {
  for (int j0 = 0; j0 < C; j0 += 16*K) {
    __m512 s[K], q[K];
    for (int k = 0; k < K; ++k) s[k] = q[k] = _mm512_setzero_ps();
    for (int i = 0; i < R; ++i) {
      const float* row = M + (size_t)i*C + j0; const __m512 wi = _mm512_set1_ps(w[i]);
      for (int k = 0; k < K; ++k) { __m512 y = _mm512_mul_ps(_mm512_loadu_ps(row+16*k), wi); s[k] = _mm512_add_ps(s[k], y); q[k] = _mm512_fmadd_ps(y,y,q[k]); }
    }
    for (int k = 0; k < K; ++k) { _mm512_storeu_ps(out + j0 + 16*k, s[k]); _mm512_storeu_ps(out + C + j0 + 16*k, q[k]); }
  }
}
// fold 16 partials of 8 rows (a[0..7]) to 8 sums: returns vector whose lanes ... (order of lanes irrelevant for timing)
static inline __m512 fold8(const __m512* a) {
  __m512 b[4];
  for (int p = 0; p < 4; ++p) b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2*p], a[2*p+1], 0x44), _mm512_shuffle_f32x4(a[2*p], a[2*p+1], 0xEE));
  __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c0, c1, 0x44), _mm512_shuffle_ps(c0, c1, 0xEE));
  return _mm512_add_ps(d, _mm512_permute_ps(d, 0xB1));
}
// row statistics: 8 rows at a time, bottom to top, 16 strided partials per row
template <int NV>  // NV = C/16
__attribute__((noinline)) void rowpass(const float* M, int R, const float* w, float* out) {
  constexpr int C = NV*16;
  __m512 wv[NV];
  for (int k = 0; k < NV; ++k) wv[k] = _mm512_loadu_ps(w + 16*k);
  for (int i0 = R - 8; i0 >= 0; i0 -= 8) {
    __m512 s[8], q[8];
    for (int r = 7; r >= 0; --r) {
      const float* row = M + (size_t)(i0 + r) * C;
      __m512 y = _mm512_mul_ps(_mm512_loadu_ps(row), wv[0]);
      __m512 ss = y, qq = _mm512_mul_ps(y, y);
      for (int k = 1; k < NV; ++k) { y = _mm512_mul_ps(_mm512_loadu_ps(row + 16*k), wv[k]); ss = _mm512_add_ps(ss, y); qq = _mm512_fmadd_ps(y, y, qq); }
      s[r] = ss; q[r] = qq;
    }
    _mm512_storeu_ps(out + i0, fold8(s));
    _mm512_storeu_ps(out + R + i0, fold8(q));
  }
}
int main(int argc, char** argv) {
  const int G = 128;
  for (int D : {128, 64}) {
  std::vector<float> X(G*D), XT(G*D), w(512, 1.01f), out(4096);
  for (auto& v : X) v = rand()/(float)RAND_MAX - 0.5f;
  for (int i=0;i<G;++i) for (int j=0;j<D;++j) XT[j*G+i]=X[i*D+j];
  auto bench = [&](auto f) { double best = 1e9; for (int rep = 0; rep < 300; ++rep) { auto t0 = std::chrono::steady_clock::now(); for (int it = 0; it < 18; ++it) f(it); auto t1 = std::chrono::steady_clock::now(); best = std::min(best, std::chrono::duration<double, std::micro>(t1-t0).count()); } return best; };
  for (int round = 0; round < 3; ++round) {
    // current: col pass over X (G x D) and col pass over XT (D x G)
    double cur = bench([&](int it){ if (it&1) colpass<4>(XT.data(), D, G, w.data(), out.data()); else colpass<4>(X.data(), G, D, w.data(), out.data()); });
    double zz = bench([&](int it){ if (it&1) { if (D==128) rowpass<8>(X.data(), G, w.data(), out.data()); else rowpass<4>(X.data(), G, w.data(), out.data()); } else colpass<4>(X.data(), G, D, w.data(), out.data()); });
    double rowonly = bench([&](int it){ if (D==128) rowpass<8>(X.data(), G, w.data(), out.data()); else rowpass<4>(X.data(), G, w.data(), out.data()); });
    printf("G=%d D=%d, 18 passes: current (X, xT) %.2f us   one matrix, zig-zag %.2f us  (%.3f)   row passes only %.2f\n", G, D, cur, zz, zz/cur, rowonly);
  }}
}
