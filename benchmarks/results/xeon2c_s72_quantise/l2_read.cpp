#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
__attribute__((noinline)) float readall(const float* p, size_t n) {
  __m512 a0=_mm512_setzero_ps(),a1=a0,a2=a0,a3=a0;
  for (size_t i=0;i<n;i+=64){ a0=_mm512_add_ps(a0,_mm512_loadu_ps(p+i)); a1=_mm512_add_ps(a1,_mm512_loadu_ps(p+i+16)); a2=_mm512_add_ps(a2,_mm512_loadu_ps(p+i+32)); a3=_mm512_add_ps(a3,_mm512_loadu_ps(p+i+48)); }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3)));
}
int main(){ for (size_t kb : {16, 32, 64, 128, 256, 1024}) { size_t n = kb*256; std::vector<float> a(2*n,1.0f); double best=1e9; volatile float sink; for(int r=0;r<2000;++r){ auto t0=std::chrono::steady_clock::now(); sink=readall(a.data()+(r&1)*n,n); auto t1=std::chrono::steady_clock::now(); best=std::min(best,std::chrono::duration<double,std::nano>(t1-t0).count()); } printf("%zu KB x2 alternating: %.1f ns, %.1f B/ns\n", kb, best, kb*1024/best); } }
