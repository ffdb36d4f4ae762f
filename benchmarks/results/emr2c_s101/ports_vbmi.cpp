// Sixty-first session: xeon2c_s67_ports/ports.cpp with VBMI byte permutes, vpermd, vpshufb and inserts from memory added
// (g++ -O2 -mavx512f -mavx512bw -mavx512vnni -mavx512vbmi -mavx512vl ports_vbmi.cpp; issue rates, 24 independent destinations).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
// Throughput of one instruction kind: 24 independent destinations per iteration.
#define I24(ins) ins(0) ins(1) ins(2) ins(3) ins(4) ins(5) ins(6) ins(7) ins(8) ins(9) ins(10) ins(11) \
                 ins(12) ins(13) ins(14) ins(15) ins(16) ins(17) ins(18) ins(19) ins(20) ins(21) ins(22) ins(23)
#define RUN(name, ins) { auto t0 = std::chrono::steady_clock::now(); \
  for (long i = 0; i < M; ++i) asm volatile(I24(ins) ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23"); \
  auto t1 = std::chrono::steady_clock::now(); double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / M; \
  printf("%-12s %.3f ns per 24 = %.2f per ns\n", name, ns, 24 / ns); }
#define DPW(o) "vpdpwssd %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define DPB(o) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define SRL(o) "vpsrlw $2, %%zmm30, %%zmm" #o "\n\t"
#define SRLD(o) "vpsrld $2, %%zmm30, %%zmm" #o "\n\t"
#define AND(o) "vpandd %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define UNP(o) "vpunpcklbw %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define FMA(o) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define MADD(o) "vpmaddwd %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define PERMB(o) "vpermb %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define PERMT2B(o) "vpermt2b %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define PERMD(o) "vpermd %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define PSHUFB(o) "vpshufb %%zmm30, %%zmm31, %%zmm" #o "\n\t"
#define PERMBM(o) "vpermb (%%rsp), %%zmm31, %%zmm" #o "\n\t"
#define INS(o) "vinserti32x4 $1, (%%rsp), %%zmm31, %%zmm" #o "\n\t"
#define CVT(o) "vcvtps2dq %%zmm30, %%zmm" #o "\n\t"
int main() {
  { const long M = 20000000;
    RUN("vpermb", PERMB) RUN("vpermt2b", PERMT2B) RUN("vpermd", PERMD) RUN("vpshufb", PSHUFB) RUN("vpermb m", PERMBM) RUN("vinserti32x4m", INS) }
    asm volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\tvpxord %%zmm31, %%zmm31, %%zmm31" ::: "xmm30", "xmm31");
    const long M = 10000000;
    RUN("vpdpwssd", DPW) RUN("vpdpbusd", DPB) RUN("vpmaddwd", MADD) RUN("vfmadd231ps", FMA)
    RUN("vpsrlw", SRL) RUN("vpsrld", SRLD) RUN("vpandd", AND) RUN("vpunpcklbw", UNP) RUN("vcvtps2dq", CVT)
    RUN("vpdpwssd", DPW)
}
