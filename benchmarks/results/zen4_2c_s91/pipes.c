// Fifty-first session: throughput of single 512-bit (and 256-bit) instructions on this core, alone and paired with
// vpdpwssd, to see which share its pipes. 12 independent accumulators per loop (no latency bound). Each row: G per s,
// and that rate over zmm vpdpwssd's alone (measured first), so no clock is assumed; for a pair row (G pairs per s),
// 1 = the two run side by side at vpdpwssd's full rate, 0.5 = they take turns on the same pipes.
#include <stdio.h>
#include <time.h>
static double secs(struct timespec a, struct timespec b) { return (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec); }
static double ref;  // zmm vpdpwssd per ns
#define R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define T(NAME, INSN) { struct timespec t0, t1; long n = 100000000L; clock_gettime(CLOCK_MONOTONIC, &t0); \
  __asm__ volatile("vpxord %%zmm20,%%zmm20,%%zmm20\n vpxord %%zmm21,%%zmm21,%%zmm21\n1:\n" INSN "dec %0\n jnz 1b" : "+r"(n) :: "memory", \
                   "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm20","xmm21"); \
  clock_gettime(CLOCK_MONOTONIC, &t1); const double r = 12 * 1e8 / secs(t0, t1) / 1e9; if (!ref) ref = r; \
  printf("%-26s %5.2f G/s  %.2f x vpdpwssd's\n", NAME, r, r / ref); }
#define Z(i) "vpdpwssd %%zmm20, %%zmm21, %%zmm" #i "\n"
#define Y(i) "vpdpwssd %%ymm20, %%ymm21, %%ymm" #i "\n"
#define ZB(i) "vpdpbusd %%zmm20, %%zmm21, %%zmm" #i "\n"
#define ZF(i) "vfmadd231ps %%zmm20, %%zmm21, %%zmm" #i "\n"
#define YF(i) "vfmadd231ps %%ymm20, %%ymm21, %%ymm" #i "\n"
#define ZU(i) "vpunpcklbw %%zmm20, %%zmm21, %%zmm" #i "\n"
#define ZA(i) "vpandd %%zmm20, %%zmm21, %%zmm" #i "\n"
#define MIXU(i) Z(i) "vpunpcklbw %%zmm20, %%zmm21, %%zmm" #i "\n"
#define MIXF(i) Z(i) "vfmadd231ps %%zmm20, %%zmm21, %%zmm" #i "\n"
#define MIXM(i) Z(i) "vmulps %%zmm20, %%zmm21, %%zmm" #i "\n"
#define MIXA(i) Z(i) "vaddps %%zmm20, %%zmm21, %%zmm" #i "\n"
#define MIXC(i) Z(i) "vcvtps2dq %%zmm21, %%zmm" #i "\n"
#define MIXS(i) Z(i) "vpermps %%zmm20, %%zmm21, %%zmm" #i "\n"
#define MIXH(i) Z(i) "vcvtph2ps %%ymm21, %%zmm" #i "\n"
int main()
{
    T("zmm vpdpwssd (warm-up)", R12(Z)) ref = 0;
    T("zmm vpdpwssd", R12(Z)) T("ymm vpdpwssd", R12(Y)) T("zmm vpdpbusd", R12(ZB)) T("zmm vfmadd231ps", R12(ZF))
    T("ymm vfmadd231ps", R12(YF)) T("zmm vpunpcklbw", R12(ZU)) T("zmm vpandd", R12(ZA))
    T("vpdpwssd + vpunpcklbw", R12(MIXU)) T("vpdpwssd + vfmadd231ps", R12(MIXF)) T("vpdpwssd + vmulps", R12(MIXM))
    T("vpdpwssd + vaddps", R12(MIXA)) T("vpdpwssd + vcvtps2dq", R12(MIXC)) T("vpdpwssd + vpermps", R12(MIXS))
    T("vpdpwssd + vcvtph2ps", R12(MIXH))
    return 0;
}
