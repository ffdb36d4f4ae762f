#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
// variant A: y = x*w; s += y; q = fma(y,y,q)   (current)
// variant B: s = fma(x,w,s); q = fma(x2,w2,q)  (x2 = x*x precomputed, w2 = w*w)
template <int K>
__attribute__((noinline)) void passA(const float* M, int R, int C, const float* w, float* out) {
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
template <int K>
__attribute__((noinline)) void passB(const float* M, const float* M2, int R, int C, const float* w, const float* w2, float* out) {
  for (int j0 = 0; j0 < C; j0 += 16*K) {
    __m512 s[K], q[K];
    for (int k = 0; k < K; ++k) s[k] = q[k] = _mm512_setzero_ps();
    for (int i = 0; i < R; ++i) {
      const float* row = M + (size_t)i*C + j0; const float* row2 = M2 + (size_t)i*C + j0;
      const __m512 wi = _mm512_set1_ps(w[i]), wi2 = _mm512_set1_ps(w2[i]);
      for (int k = 0; k < K; ++k) { s[k] = _mm512_fmadd_ps(_mm512_loadu_ps(row+16*k), wi, s[k]); q[k] = _mm512_fmadd_ps(_mm512_loadu_ps(row2+16*k), wi2, q[k]); }
    }
    for (int k = 0; k < K; ++k) { _mm512_storeu_ps(out + j0 + 16*k, s[k]); _mm512_storeu_ps(out + C + j0 + 16*k, q[k]); }
  }
}
// variant C: interleaved layout: x and x2 in same row chunk (row of 2C floats: x block then x2 block)
int main(int argc, char** argv) {
  int R = 128, C = argc > 1 ? atoi(argv[1]) : 128;
  std::vector<float> X(R*C), X2(R*C), XT(R*C), XT2(R*C), w(512, 1.01f), w2(512), out(1024);
  for (auto& v : X) v = rand()/(float)RAND_MAX - 0.5f;
  for (int i = 0; i < R*C; ++i) { X2[i] = X[i]*X[i]; XT[i]=X[i]; XT2[i]=X2[i]; }
  for (int i=0;i<512;++i) w2[i]=w[i]*w[i];
  auto bench = [&](auto f) { double best = 1e9; for (int rep = 0; rep < 200; ++rep) { auto t0 = std::chrono::steady_clock::now(); for (int it = 0; it < 18; ++it) f(it); auto t1 = std::chrono::steady_clock::now(); best = std::min(best, std::chrono::duration<double, std::micro>(t1-t0).count()); } return best; };
  for (int round = 0; round < 3; ++round) {
  double a4 = bench([&](int it){ if (it&1) passA<4>(XT.data(), C, R, w.data(), out.data()); else passA<4>(X.data(), R, C, w.data(), out.data()); });
  double a8 = bench([&](int it){ if (it&1) passA<8>(XT.data(), C, R, w.data(), out.data()); else passA<8>(X.data(), R, C, w.data(), out.data()); });
  double b4 = bench([&](int it){ if (it&1) passB<4>(XT.data(), XT2.data(), C, R, w.data(), w2.data(), out.data()); else passB<4>(X.data(), X2.data(), R, C, w.data(), w2.data(), out.data()); });
  double b8 = bench([&](int it){ if (it&1) passB<8>(XT.data(), XT2.data(), C, R, w.data(), w2.data(), out.data()); else passB<8>(X.data(), X2.data(), R, C, w.data(), w2.data(), out.data()); });
  printf("C=%d 18 passes: A4 %.2f us  A8 %.2f  B4 %.2f  B8 %.2f  (B4/A4 %.3f)\n", C, a4, a8, b4, b8, b4/a4);
  }
}
