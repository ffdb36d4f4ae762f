#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <unistd.h>
#include <sys/syscall.h>
struct alignas(64) Cfg { uint8_t palette=1, start=0; uint8_t r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
alignas(64) uint8_t A[16*64], B[16*64]; alignas(64) int32_t C[16*16];
int main(int argc, char** argv){
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
  Cfg c; for(int t=0;t<8;t++){c.rows[t]= t<5?9:16; c.colsb[t]=64;}
  _tile_loadconfig(&c); memset(A,1,sizeof A); memset(B,2,sizeof B);
  const long N=200000; long x = 3; long nmul = atol(argv[1]);
  auto T=[&](const char* name, bool tdp, bool sc){ auto t0=std::chrono::steady_clock::now();
    for(long i=0;i<N;i++){
      if (tdp) { _tile_loadd(4,A,64); _tile_loadd(5,B,64); for(int k=0;k<4;k++){_tile_dpbuud(0,4,5);_tile_dpbuud(1,4,5);_tile_dpbuud(2,4,5);_tile_dpbuud(3,4,5);} _tile_stored(0,C,64); x += C[0]; }
      if (sc) { long n = nmul; asm volatile("1: imul %0, %0\n sub $1, %1\n jnz 1b" : "+r"(x), "+r"(n)); }
    }
    auto t1=std::chrono::steady_clock::now(); printf("%-28s %.0f ns/iter\n", name, std::chrono::duration<double,std::nano>(t1-t0).count()/N); };
  T("tdp burst only", true, false); T("imul chain only", false, true); T("alternating", true, true);
  _tile_release(); printf("%ld\n", x);
}
