// Fourteenth session: vector-instruction throughput on the AVX2 2-core box (Zen 3), calibrated against a dependent
// add chain (1 cycle each). Shows the int16 kernels' ceiling there: vpmaddwd + vpaddd pairs ~1.4-1.5 a cycle
// (16 MACs each) against 2 FMAs a cycle (8 MACs each). Output: zen3_s49_vector_throughput.log.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
  const long N = 200000000; double t = now(); long a = 0;
  for (long i = 0; i < N; i += 8) asm volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0" : "+r"(a));
  double cyc = (now() - t) / N; long M = N / 4;
  t = now();
  for (long i = 0; i < M; i += 8) asm volatile(
    "vpaddd %%ymm1,%%ymm0,%%ymm0\n\t vpaddd %%ymm1,%%ymm2,%%ymm2\n\t vpaddd %%ymm1,%%ymm3,%%ymm3\n\t vpaddd %%ymm1,%%ymm4,%%ymm4\n\t"
    "vpaddd %%ymm1,%%ymm5,%%ymm5\n\t vpaddd %%ymm1,%%ymm6,%%ymm6\n\t vpaddd %%ymm1,%%ymm7,%%ymm7\n\t vpaddd %%ymm1,%%ymm8,%%ymm8\n\t" ::: "xmm0","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8");
  printf("vpaddd: %.2f/cycle\n", M / ((now() - t) / cyc));
  t = now();
  for (long i = 0; i < M; i += 8) asm volatile(
    "vpmaddwd %%ymm1,%%ymm9,%%ymm10\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm11\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm12\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm13\n\t"
    "vpaddd %%ymm10,%%ymm0,%%ymm0\n\t vpaddd %%ymm11,%%ymm2,%%ymm2\n\t vpaddd %%ymm12,%%ymm3,%%ymm3\n\t vpaddd %%ymm13,%%ymm4,%%ymm4\n\t"
    "vpmaddwd %%ymm1,%%ymm9,%%ymm10\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm11\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm12\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm13\n\t"
    "vpaddd %%ymm10,%%ymm5,%%ymm5\n\t vpaddd %%ymm11,%%ymm6,%%ymm6\n\t vpaddd %%ymm12,%%ymm7,%%ymm7\n\t vpaddd %%ymm13,%%ymm8,%%ymm8\n\t"
    ::: "xmm0","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm10","xmm11","xmm12","xmm13");
  printf("madd+add (4 temps): %.2f pairs/cycle\n", M / ((now() - t) / cyc));
  t = now();
  for (long i = 0; i < M; i += 8) asm volatile(
    "vpmaddwd %%ymm1,%%ymm9,%%ymm10\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm11\n\t vpaddd %%ymm10,%%ymm11,%%ymm10\n\t vpaddd %%ymm10,%%ymm0,%%ymm0\n\t"
    "vpmaddwd %%ymm1,%%ymm9,%%ymm12\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm13\n\t vpaddd %%ymm12,%%ymm13,%%ymm12\n\t vpaddd %%ymm12,%%ymm2,%%ymm2\n\t"
    "vpmaddwd %%ymm1,%%ymm9,%%ymm10\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm11\n\t vpaddd %%ymm10,%%ymm11,%%ymm10\n\t vpaddd %%ymm10,%%ymm3,%%ymm3\n\t"
    "vpmaddwd %%ymm1,%%ymm9,%%ymm12\n\t vpmaddwd %%ymm1,%%ymm9,%%ymm13\n\t vpaddd %%ymm12,%%ymm13,%%ymm12\n\t vpaddd %%ymm12,%%ymm4,%%ymm4\n\t"
    ::: "xmm0","xmm2","xmm3","xmm4","xmm10","xmm11","xmm12","xmm13");
  printf("madd pairs summed then add: %.2f madds/cycle\n", M / ((now() - t) / cyc));
  t = now();
  for (long i = 0; i < M; i += 8) asm volatile(
    "vpmaddubsw %%ymm1,%%ymm9,%%ymm10\n\t vpmaddubsw %%ymm1,%%ymm9,%%ymm11\n\t vpmaddubsw %%ymm1,%%ymm9,%%ymm12\n\t vpmaddubsw %%ymm1,%%ymm9,%%ymm13\n\t"
    "vpmaddubsw %%ymm1,%%ymm9,%%ymm10\n\t vpmaddubsw %%ymm1,%%ymm9,%%ymm11\n\t vpmaddubsw %%ymm1,%%ymm9,%%ymm12\n\t vpmaddubsw %%ymm1,%%ymm9,%%ymm13\n\t"
    ::: "xmm10","xmm11","xmm12","xmm13");
  printf("vpmaddubsw: %.2f/cycle\n", M / ((now() - t) / cyc));
  t = now();
  for (long i = 0; i < M; i += 8) asm volatile(
    "vpmullw %%ymm1,%%ymm9,%%ymm10\n\t vpmullw %%ymm1,%%ymm9,%%ymm11\n\t vpmullw %%ymm1,%%ymm9,%%ymm12\n\t vpmullw %%ymm1,%%ymm9,%%ymm13\n\t"
    "vpaddw %%ymm10,%%ymm0,%%ymm0\n\t vpaddw %%ymm11,%%ymm2,%%ymm2\n\t vpaddw %%ymm12,%%ymm3,%%ymm3\n\t vpaddw %%ymm13,%%ymm4,%%ymm4\n\t"
    ::: "xmm0","xmm2","xmm3","xmm4","xmm10","xmm11","xmm12","xmm13");
  printf("vpmullw+vpaddw: %.2f pairs/cycle\n", (M/2) / ((now() - t) / cyc));
  t = now();
  for (long i = 0; i < M; i += 8) asm volatile(
    "vfmadd231ps %%ymm1,%%ymm9,%%ymm0\n\t vfmadd231ps %%ymm1,%%ymm9,%%ymm2\n\t vfmadd231ps %%ymm1,%%ymm9,%%ymm3\n\t vfmadd231ps %%ymm1,%%ymm9,%%ymm4\n\t"
    "vfmadd231ps %%ymm1,%%ymm9,%%ymm5\n\t vfmadd231ps %%ymm1,%%ymm9,%%ymm6\n\t vfmadd231ps %%ymm1,%%ymm9,%%ymm7\n\t vfmadd231ps %%ymm1,%%ymm9,%%ymm8\n\t"
    "vpaddd %%ymm1,%%ymm10,%%ymm10\n\t vpaddd %%ymm1,%%ymm11,%%ymm11\n\t vpaddd %%ymm1,%%ymm12,%%ymm12\n\t vpaddd %%ymm1,%%ymm13,%%ymm13\n\t"
    ::: "xmm0","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm10","xmm11","xmm12","xmm13");
  printf("8 fma + 4 vpaddd: %.2f fma/cycle\n", M / ((now() - t) / cyc));
}
