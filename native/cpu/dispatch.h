#ifndef KVARN_DISPATCH_H
#define KVARN_DISPATCH_H
#include "kvarn/kernels.h"
namespace kvarn {
// The active table, or nullptr when KVARN_ISA named an ISA that cannot run.
const KernelTable* active_kernels();
bool cpu_has_avx512_vnni();
// How the avx512 attention computes q.k on 4-bit keys: float FMA, or the
// query rounded to int16 (vpdpwssd) or int8 (vpdpbusd) against the integer
// codes. The integer modes need VNNI; without it this returns kScoresFloat.
// KVARN_SCORES=float|int16|int8 or kvarn_set_score_mode(); read per call.
enum { kScoresFloat = 0, kScoresInt16 = 1, kScoresInt8 = 2 };
int score_mode();
void hadamard_f64_rows(double* x, int64_t rows, int head_dim);
}  // namespace kvarn
#endif
