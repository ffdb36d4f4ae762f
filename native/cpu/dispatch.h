#ifndef KVARN_DISPATCH_H
#define KVARN_DISPATCH_H
#include "kvarn/kernels.h"
namespace kvarn {
// The active table, or nullptr when KVARN_ISA named an ISA that cannot run.
const KernelTable* active_kernels();
bool cpu_has_avx512_vnni();
// Whether the avx2 int16 kernels use AVX-VNNI's VEX vpdpwssd (default: where cpuid has it;
// kvarn_set_avx_vnni() turns it off, for tests and A/B timings).
bool avx_vnni_on();
// How the active SIMD attention computes q.k on 4-bit keys and p.v on 2-bit values:
// float FMA, or int16-rounded queries and weights against the integer codes with
// exact int32 sums (avx512: vpdpwssd with VNNI; avx2: vpmaddwd + vpaddd), or int8
// queries (vpdpbusd; avx512 with VNNI only). Returns the mode the active table runs
// (see dispatch.cpp). KVARN_SCORES=float|int16|int8 or kvarn_set_score_mode(); read per call.
enum { kScoresFloat = 0, kScoresInt16 = 1, kScoresInt8 = 2 };
int score_mode();
void hadamard_f64_rows(double* x, int64_t rows, int head_dim);
}  // namespace kvarn
#endif
