#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
// One K-loop step's multiply side at 4 heads, two ways: the query pair broadcast from a
// dword (vpbroadcastd m32) then register vpmaddwd, or a pre-broadcast ymm as vpmaddwd's memory operand.
#define ACCS "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13"
#define HEAD_B(h, a, b) "vpbroadcastd " #h "*4(%0), %%ymm11\n\t" \
  "vpmaddwd %%ymm11, %%ymm14, %%ymm12\n\tvpaddd %%ymm12, %%ymm" #a ", %%ymm" #a "\n\t" \
  "vpmaddwd %%ymm11, %%ymm15, %%ymm13\n\tvpaddd %%ymm13, %%ymm" #b ", %%ymm" #b "\n\t"
#define HEAD_M(h, a, b) \
  "vpmaddwd " #h "*32(%1), %%ymm14, %%ymm12\n\tvpaddd %%ymm12, %%ymm" #a ", %%ymm" #a "\n\t" \
  "vpmaddwd " #h "*32(%1), %%ymm15, %%ymm13\n\tvpaddd %%ymm13, %%ymm" #b ", %%ymm" #b "\n\t"
#define UNPACK "vmovq (%2), %%xmm14\n\tvmovq 64(%2), %%xmm15\n\tvpunpcklbw %%xmm15, %%xmm14, %%xmm14\n\t" \
  "vpmovzxbw %%xmm14, %%ymm14\n\tvpsrlw $4, %%ymm14, %%ymm15\n\tvpand %%ymm10, %%ymm14, %%ymm14\n\tvpand %%ymm10, %%ymm15, %%ymm15\n\t"
#define STEP_B UNPACK HEAD_B(0,0,1) HEAD_B(1,2,3) HEAD_B(2,4,5) HEAD_B(3,6,7)
#define STEP_M UNPACK HEAD_M(0,0,1) HEAD_M(1,2,3) HEAD_M(2,4,5) HEAD_M(3,6,7)
#define STEP_BO HEAD_B(0,0,1) HEAD_B(1,2,3) HEAD_B(2,4,5) HEAD_B(3,6,7)
#define STEP_MO HEAD_M(0,0,1) HEAD_M(1,2,3) HEAD_M(2,4,5) HEAD_M(3,6,7)
#define RUN(name, step) { auto t0 = std::chrono::steady_clock::now(); \
  for (long i = 0; i < M; ++i) asm volatile(step step step step :: "r"(q), "r"(qb), "r"(codes) : ACCS, "xmm14", "xmm15", "memory"); \
  auto t1 = std::chrono::steady_clock::now(); double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / (4.0 * M); \
  printf("%-40s %.3f ns = %.2f cycles per step\n", name, ns, ns * ghz); }
int main() {
    alignas(64) static int32_t q[64] = {1}, qb[256] = {1};
    alignas(64) static uint8_t codes[256] = {1};
    double ghz;
    {
        const long N = 100000000; uint64_t x = 3;
        auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < N; ++i) asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
        auto t1 = std::chrono::steady_clock::now();
        ghz = 3.0 / (std::chrono::duration<double, std::nano>(t1 - t0).count() / (4.0 * N));
        printf("clock %.2f GHz\n", ghz);
    }
    asm volatile("vpcmpeqd %%ymm10, %%ymm10, %%ymm10\n\tvpsrlw $12, %%ymm10, %%ymm10" ::: "xmm10");
    const long M = 5000000;
    for (int r = 0; r < 3; ++r) {
        RUN("unpack + bcast m32 + 8 madd/add", STEP_B) RUN("unpack + madd m256 + 8 madd/add", STEP_M)
        RUN("bcast m32 + 8 madd/add (no unpack)", STEP_BO) RUN("madd m256 (no unpack)", STEP_MO)
    }
}
