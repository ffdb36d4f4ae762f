// Dual-axis log-space variance normalisation (SPEC §3), shared by every ISA.
#ifndef KVARN_SINKHORN_H
#define KVARN_SINKHORN_H

#include <stddef.h>

namespace kvarn {

// X is rows x cols, row-major. Writes positive row scales r[rows] and column
// scales c[cols] of the lowest-imbalance candidate (identity included), so that
// X / (r ⊗ c) has near-equal standard deviation along both axes.
void sinkhorn_balance(const float* X, int rows, int cols, int iters, float* r, float* c);

// Unbiased std of the n values x[k * stride] * w[k] (float products), sums in
// double in k order: the statistics' fallback where the float one-pass formula
// would cancel. Called by the SIMD quantisers too, so it is compiled once, here.
double weighted_std_double(const float* x, ptrdiff_t stride, const float* w, int n);

// The fallback test on float sums: use the double path unless the spread
// dominates (Σ(y - mean)² >= Σy² / 8, i.e. mean² <= 7 var) and Σy² is finite.
// There the float sums' error (about n ulp of Σy²) is at most 8n ulp of the variance.
constexpr double kvarn_cancel_fraction = 0.125;

}  // namespace kvarn

#endif
