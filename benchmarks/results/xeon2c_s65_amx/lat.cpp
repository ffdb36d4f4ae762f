#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <unistd.h>
#include <sys/syscall.h>
struct alignas(64) Cfg { uint8_t palette=1, start=0; uint8_t r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
alignas(64) uint8_t A[16*64], B[4][16*64]; alignas(64) int32_t C[16*16];
int main(){
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
  Cfg c; for(int t=0;t<8;t++){c.rows[t]= t<5?9:16; c.colsb[t]=64;}
  _tile_loadconfig(&c);
  memset(A,1,sizeof A); memset(B,2,sizeof B);
  const long N=1000000; __m512i v=_mm512_set1_epi32(1);
  auto T=[&](const char* name, auto f){ auto t0=std::chrono::steady_clock::now(); for(long i=0;i<N;i++) f(i); auto t1=std::chrono::steady_clock::now(); printf("%-50s %.1f cycles\n", name, std::chrono::duration<double,std::nano>(t1-t0).count()/N*3.4); };
  _tile_loadd(4,A,64);
  T("tdp only (1 C)", [&](long){ _tile_dpbuud(0,4,5); });
  T("tdp x4 (4 C)", [&](long){ _tile_dpbuud(0,4,5); _tile_dpbuud(1,4,5);_tile_dpbuud(2,4,5);_tile_dpbuud(3,4,5);});
  T("tileload B + tdp", [&](long){ _tile_loadd(5,B[0],64); _tile_dpbuud(0,4,5); });
  T("16 zmm stores to B, tileload B, tdp", [&](long i){ for(int r=0;r<16;r++) _mm512_store_si512(B[0]+64*r, v); _tile_loadd(5,B[0],64); _tile_dpbuud(0,4,5); });
  T("16 zmm stores to B only", [&](long i){ for(int r=0;r<16;r++) _mm512_store_si512(B[0]+64*r, v); asm volatile(""::"r"(B):"memory"); });
  T("16 stores to B[i%4], tileload B[(i+2)%4], tdp", [&](long i){ for(int r=0;r<16;r++) _mm512_store_si512(B[i%4]+64*r, v); _tile_loadd(5,B[(i+2)%4],64); _tile_dpbuud(0,4,5); });
  T("tdp, tilestore C, zmm load C", [&](long){ _tile_dpbuud(0,4,5); _tile_stored(0,C,64); v=_mm512_add_epi32(v,_mm512_load_si512(C)); });
  T("tdp, tilestore C", [&](long){ _tile_dpbuud(0,4,5); _tile_stored(0,C,64); });
  _tile_release(); printf("%d\n", _mm512_reduce_add_epi32(v));
}
