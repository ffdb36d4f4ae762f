#ifndef KVARN_DISPATCH_H
#define KVARN_DISPATCH_H
#include "kvarn/kernels.h"
namespace kvarn {
// The active table, or nullptr when KVARN_ISA named an ISA that cannot run.
const KernelTable* active_kernels();
bool cpu_has_avx512_vnni();
void hadamard_f64_rows(double* x, int64_t rows, int head_dim);
}  // namespace kvarn
#endif
