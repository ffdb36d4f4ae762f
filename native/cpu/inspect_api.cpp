// Exposes intermediate results of the quantiser (the balancing scales) so
// tests can check them against an independent oracle. Not on any hot path.
#include "dispatch.h"
#include "kvarn/kvarn.h"
#include "sinkhorn.h"

extern "C" int kvarn_balance(const float* x, int32_t rows, int32_t cols, int32_t iters, float* r, float* c)
{
    auto float_aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % alignof(float) == 0; };
    if (!x || !r || !c || rows < 2 || cols < 2 || iters < 0 || iters > KVARN_MAX_SINKHORN_ITERS ||
        (uint64_t)rows * (uint64_t)cols > (uint64_t)PTRDIFF_MAX / sizeof(float) || !float_aligned(x) ||
        !float_aligned(r) || !float_aligned(c))
        return KVARN_ERR_ARGUMENT;
    if (!kvarn::active_kernels()) return KVARN_ERR_ISA;  // as every kernel call while a forced ISA cannot run
    try {
        kvarn::sinkhorn_balance(x, rows, cols, iters, r, c);
    } catch (...) {
        return KVARN_ERR_INTERNAL;
    }
    return KVARN_OK;
}
