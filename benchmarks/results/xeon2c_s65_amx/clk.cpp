#include <chrono>
#include <cstdio>
int main(){ long n=200000000; long x=3; auto t0=std::chrono::steady_clock::now();
 asm volatile("1: imul %0, %0\n imul %0, %0\n imul %0, %0\n imul %0, %0\n sub $1, %1\n jnz 1b" : "+r"(x), "+r"(n));
 auto t1=std::chrono::steady_clock::now(); double ns=std::chrono::duration<double,std::nano>(t1-t0).count();
 printf("%.2f GHz (imul latency 3)\n", 4*3*2e8/ns); }
