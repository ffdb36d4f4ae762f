// avx2 kernels: placeholder until the SIMD work lands; returning nullptr makes
// dispatch fall back to the next lower ISA for every kernel.
#include "kvarn/kernels.h"

namespace kvarn {

const KernelTable* avx2_kernels() { return nullptr; }

}  // namespace kvarn
