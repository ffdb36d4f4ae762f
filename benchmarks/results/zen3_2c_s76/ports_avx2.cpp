#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
// Zen 3 (AVX2, 16 ymm): throughput of one instruction kind with 12 independent destinations
// per group (ymm0-11), sources ymm14/ymm15; groups repeated 4x per iteration (48 instructions).
#define I12(ins) ins(0) ins(1) ins(2) ins(3) ins(4) ins(5) ins(6) ins(7) ins(8) ins(9) ins(10) ins(11)
#define I48(ins) I12(ins) I12(ins) I12(ins) I12(ins)
#define CLOB "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13"
#define RUN(name, ins, per) { auto t0 = std::chrono::steady_clock::now(); \
  for (long i = 0; i < M; ++i) asm volatile(I48(ins) :: "r"(buf) : CLOB, "memory"); \
  auto t1 = std::chrono::steady_clock::now(); double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / M; \
  printf("%-28s %.3f ns per 48 = %.2f per ns = %.2f per cycle\n", name, ns, 48 * per / ns, 48 * per / ns / ghz); }
#define MADD(o) "vpmaddwd %%ymm14, %%ymm15, %%ymm" #o "\n\t"
#define ADDD(o) "vpaddd %%ymm14, %%ymm15, %%ymm" #o "\n\t"
#define AND(o) "vpand %%ymm14, %%ymm15, %%ymm" #o "\n\t"
#define SRLW(o) "vpsrlw $4, %%ymm14, %%ymm" #o "\n\t"
#define SRLV(o) "vpsrlvd %%ymm14, %%ymm15, %%ymm" #o "\n\t"
#define UNP(o) "vpunpcklbw %%xmm14, %%xmm15, %%xmm" #o "\n\t"
#define ZXBW(o) "vpmovzxbw %%xmm14, %%ymm" #o "\n\t"
#define INS(o) "vinserti128 $1, %%xmm14, %%ymm15, %%ymm" #o "\n\t"
#define BCST(o) "vpbroadcastd (%0), %%ymm" #o "\n\t"
#define MOVQ(o) "vmovq (%0), %%xmm" #o "\n\t"
#define MADDM(o) "vpmaddwd (%0), %%ymm15, %%ymm" #o "\n\t"
#define FMA(o) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #o "\n\t"
#define CVT(o) "vcvtdq2ps %%ymm14, %%ymm" #o "\n\t"
// dp16 as the kernel runs it: product into a temp (ymm12/13 alternating), add into an accumulator
#define DP(o) "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\tvpaddd %%ymm12, %%ymm" #o ", %%ymm" #o "\n\t"
#define MADDSH(o) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #o "\n\t"
int main() {
    alignas(64) static int32_t buf[64] = {1, 2, 3, 4};
    asm volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15" ::: "xmm14", "xmm15");
    double ghz;
    {
        const long N = 100000000; uint64_t x = 3;
        auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < N; ++i) asm volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
        auto t1 = std::chrono::steady_clock::now();
        double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / (4.0 * N);
        ghz = 3.0 / ns;
        printf("imul chain %.4f ns -> %.2f GHz (3-cycle latency)\n", ns, ghz);
    }
    const long M = 2000000;
    RUN("vpmaddwd", MADD, 1) RUN("vpaddd", ADDD, 1) RUN("vpand", AND, 1) RUN("vpsrlw imm", SRLW, 1)
    RUN("vpsrlvd", SRLV, 1) RUN("vpunpcklbw xmm", UNP, 1) RUN("vpmovzxbw ymm", ZXBW, 1) RUN("vinserti128", INS, 1)
    RUN("vpbroadcastd m32", BCST, 1) RUN("vmovq m64", MOVQ, 1) RUN("vpmaddwd m256", MADDM, 1)
    RUN("vfmadd231ps", FMA, 1) RUN("vcvtdq2ps", CVT, 1) RUN("vpmaddubsw", MADDSH, 1)
    RUN("vpmaddwd+vpaddd (per pair)", DP, 1)
    RUN("vpmaddwd", MADD, 1)
}
