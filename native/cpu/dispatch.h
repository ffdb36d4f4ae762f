#ifndef KVARN_DISPATCH_H
#define KVARN_DISPATCH_H
#include "kvarn/kernels.h"
namespace kvarn {
// The active table, or nullptr when KVARN_ISA named an ISA that cannot run.
const KernelTable* active_kernels();
// Whether the int16 kernels use VNNI's vpdpwssd: avx2 the VEX form (AVX-VNNI), avx512
// the EVEX form (AVX-512 VNNI); default where cpuid has it, kvarn_set_vnni(0) turns both
// off (their vpmaddwd + vpaddd forms, as on CPUs without VNNI: tests and A/B timings).
bool avx_vnni_on();
bool avx512_vnni_on();
// Whether the avx512 kernels use AVX-512 VBMI's byte permutes (vpermb, vpermt2b) for the 2-bit value codes' layout:
// default where cpuid has it; kvarn_set_vbmi(0) selects the form that AVX-512 CPUs without VBMI run (Skylake-SP/X,
// Cascade Lake), whose results are bit-identical (tests and A/B timings).
bool avx512_vbmi_on();
// How the active SIMD attention computes q.k on 4-bit keys and p.v on 2-bit values:
// float FMA, or int16-rounded queries and weights against the integer codes with
// exact int32 sums (vpdpwssd with VNNI, else vpmaddwd + vpaddd), or int8 queries
// (vpdpbusd, or avx2's vpmaddubsw form; avx512 only with VNNI). Returns the mode the active table runs
// (see dispatch.cpp). KVARN_SCORES=float|int16|int8 or kvarn_set_score_mode(); read per call.
enum { kScoresFloat = 0, kScoresInt16 = 1, kScoresInt8 = 2 };
int score_mode();
void hadamard_f64_rows(double* x, int64_t rows, int head_dim);

// The SIMD attention kernels take the query heads of one pass over a tile (1..4) as a template
// argument: with_head_count(nh, [&](auto heads) { kernel<decltype(heads)::value>(...); }) calls
// the instance for nh (4 above 4). Each caller's lambda has a type local to its translation unit,
// so these instantiations never leave it (the ISA files' link-hygiene rule).
template <int N>
struct HeadCount {
    static constexpr int value = N;
};
template <class F>
inline void with_head_count(int nh, F&& f)
{
    switch (nh) {
        case 1: f(HeadCount<1>{}); break;
        case 2: f(HeadCount<2>{}); break;
        case 3: f(HeadCount<3>{}); break;
        default: f(HeadCount<4>{}); break;
    }
}
}  // namespace kvarn
#endif
