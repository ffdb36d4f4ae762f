#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <unistd.h>
#include <sys/syscall.h>
struct alignas(64) Cfg { uint8_t palette=1, start=0; uint8_t r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
alignas(64) uint8_t A[16*64], B[4][16*64]; alignas(64) int32_t C[16*16];
int main(int argc, char** argv){
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
  Cfg c; for(int t=0;t<8;t++){c.rows[t]= t<5?9:16; c.colsb[t]=64;}
  _tile_loadconfig(&c);
  memset(A,1,sizeof A); memset(B,2,sizeof B);
  const long N=200000; __m512i v[8]; for(int i=0;i<8;i++) v[i]=_mm512_set1_epi32(i);
  int ntdp = 16, nvec = atoi(argv[1]);
  auto T=[&](const char* name, bool tdp, bool vec){ auto t0=std::chrono::steady_clock::now();
    for(long i=0;i<N;i++){
      if (tdp) { _tile_loadd(4,A,64); _tile_loadd(5,B[0],64); for(int k=0;k<ntdp;k+=4){_tile_dpbuud(0,4,5);_tile_dpbuud(1,4,5);_tile_dpbuud(2,4,5);_tile_dpbuud(3,4,5);} _tile_stored(0,C,64); v[0]=_mm512_add_epi32(v[0],_mm512_load_si512(C)); }
      if (vec) for(int k=0;k<nvec;k++) for(int j=0;j<8;j++) v[j]=_mm512_dpwssd_epi32(v[j],v[(j+1)&7],v[(j+2)&7]);
    }
    auto t1=std::chrono::steady_clock::now(); printf("%-28s %.0f cycles/iter\n", name, std::chrono::duration<double,std::nano>(t1-t0).count()/N*3.4); };
  T("tdp burst only", true, false); T("vector only", false, true); T("alternating", true, true);
  _tile_release(); int s=0; for(int i=0;i<8;i++) s+=_mm512_reduce_add_epi32(v[i]); printf("%d\n", s);
}
