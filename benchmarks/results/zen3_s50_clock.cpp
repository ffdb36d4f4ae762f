// Fifteenth session: this core's clock from a dependent chain of 1-cycle adds (8 per loop iteration; the
// loop's own increment and branch run beside it). g++ -O2 zen3_s50_clock.cpp && taskset -c 0 ./a.out
#include <chrono>
#include <cstdio>
int main(){ long x=0; const long N=2000000000L; double best=1e9;
 for(int r=0;r<3;++r){ auto t=std::chrono::steady_clock::now();
  for(long i=0;i<N;i+=8){ asm volatile("add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0":"+r"(x)); }
  double d=std::chrono::duration<double>(std::chrono::steady_clock::now()-t).count(); if(d<best)best=d;}
 printf("%.2f GHz\n", N/best/1e9); }
