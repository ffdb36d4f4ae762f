// Dual-axis log-space variance normalisation (SPEC §3), shared by every ISA.
#ifndef KVARN_SINKHORN_H
#define KVARN_SINKHORN_H

namespace kvarn {

// X is rows x cols, row-major. Writes positive row scales r[rows] and column
// scales c[cols] of the lowest-imbalance candidate (identity included), so that
// X / (r ⊗ c) has near-equal standard deviation along both axes.
void sinkhorn_balance(const float* X, int rows, int cols, int iters, float* r, float* c);

}  // namespace kvarn

#endif
