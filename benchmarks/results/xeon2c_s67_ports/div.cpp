#include <immintrin.h>
#include <chrono>
#include <cstdio>
#define I8(ins) ins(0) ins(1) ins(2) ins(3) ins(4) ins(5) ins(6) ins(7)
#define DIV(o) "vdivps %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define MUL(o) "vmulps %%zmm30, %%zmm31, %%zmm" #o "\n\t"
int main() {
    asm volatile("vbroadcastss %0, %%zmm30\n\tvbroadcastss %0, %%zmm31" :: "m"(*(const float[]){1.7f}) : "xmm30", "xmm31");
    const long M = 10000000;
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < M; ++i) asm volatile(I8(DIV) ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7");
    auto t1 = std::chrono::steady_clock::now();
    printf("vdivps zmm: %.2f cycles each at 3.47 GHz\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / (8.0 * M) * 3.47);
    t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < M; ++i) asm volatile(I8(MUL) ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7");
    t1 = std::chrono::steady_clock::now();
    printf("vmulps zmm: %.2f cycles each\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / (8.0 * M) * 3.47);
}
