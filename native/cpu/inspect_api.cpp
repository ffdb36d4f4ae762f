// Exposes intermediate results of the quantiser (the balancing scales) so
// tests can check them against an independent oracle. Not on any hot path.
#include "kvarn/kvarn.h"
#include "sinkhorn.h"

extern "C" int kvarn_balance(const float* x, int32_t rows, int32_t cols, int32_t iters, float* r, float* c)
{
    if (!x || !r || !c || rows < 2 || cols < 2 || iters < 0 || iters > KVARN_MAX_SINKHORN_ITERS ||
        (uint64_t)rows * (uint64_t)cols > (uint64_t)PTRDIFF_MAX / sizeof(float)) return KVARN_ERR_ARGUMENT;
    try {
        kvarn::sinkhorn_balance(x, rows, cols, iters, r, c);
    } catch (...) {
        return KVARN_ERR_INTERNAL;
    }
    return KVARN_OK;
}
