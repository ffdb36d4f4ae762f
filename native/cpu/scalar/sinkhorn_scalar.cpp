// Sinkhorn-style balancing, SPEC §3. The statistics use two identities so that
// an iteration reads the tile twice instead of materialising X / (r ⊗ c) twice
// and reading it three times:
//   std over rows of X[i][j] / c[j] / r[i]  =  (1/c[j]) · std_i(X[i][j] · (1/r[i]))
//   std over cols of X[i][j] / c[j] / r[i]  =  (1/r[i]) · std_j(X[i][j] · (1/c[j]))
// and the row statistic after the row update is the one computed just before it,
// times the new 1/r (the columns' scales did not change in between). The result
// equals SPEC's order of operations up to float rounding (a few ulp in the
// scales; tests compare with a float64 oracle). SIMD kernels reproduce this
// file bit for bit: the same float products, sums in double in the same order
// (one pass: y² of a float is exact in double, so an FMA rounds like mul + add).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvarn/format.h"
#include "sinkhorn.h"

namespace kvarn {
namespace {

// Unbiased std from a sum and a sum of squares of n values.
double std_from_sums(double sum, double sum_sq, int n)
{
    const double mean = sum / n;
    const double var = (sum_sq - sum * mean) / (n - 1);
    return std::sqrt(std::max(var, 0.0));
}

// out[j] = std over i of X[i][j] * w[i]   (each column, rows weighted)
void weighted_column_std(const float* X, int rows, int cols, const float* w, double* out)
{
    std::vector<double> sum(cols, 0.0), sum_sq(cols, 0.0);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
            const double y = X[(size_t)i * cols + j] * w[i];
            sum[j] += y;
            sum_sq[j] += y * y;
        }
    for (int j = 0; j < cols; ++j) out[j] = std_from_sums(sum[j], sum_sq[j], rows);
}

// out[i] = std over j of X[i][j] * w[j]   (each row, columns weighted)
void weighted_row_std(const float* X, int rows, int cols, const float* w, double* out)
{
    for (int i = 0; i < rows; ++i) {
        double sum = 0.0, sum_sq = 0.0;
        for (int j = 0; j < cols; ++j) {
            const double y = X[(size_t)i * cols + j] * w[j];
            sum += y;
            sum_sq += y * y;
        }
        out[i] = std_from_sums(sum, sum_sq, cols);
    }
}

// max/min of raw[i] * w[i] (the std of the current matrix along one axis), in
// double: near convergence candidates differ by less than a float ulp.
double spread(const double* raw, const float* w, int n)
{
    double lo = raw[0] * w[0], hi = lo;
    for (int i = 1; i < n; ++i) {
        const double s = raw[i] * w[i];
        lo = std::min(lo, s);
        hi = std::max(hi, s);
    }
    return hi / std::max(lo, (double)KVARN_IMBALANCE_EPS);
}

float clampf(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

// log_scale += log(clamped std), clamped; returns exp(log_scale).
float update_log_scale(float& log_scale, float std)
{
    log_scale = clampf(log_scale + std::log(clampf(std, KVARN_STD_MIN, KVARN_STD_MAX)), KVARN_LOG_SCALE_MIN,
                       KVARN_LOG_SCALE_MAX);
    return std::exp(log_scale);
}

}  // namespace

void sinkhorn_balance(const float* X, int rows, int cols, int iters, float* r, float* c)
{
    // lr/lc: log scales; er/ec = exp of them; ir/ic = 1/er, 1/ec (the weights of the statistics).
    std::vector<float> lr(rows, 0.0f), lc(cols, 0.0f), er(rows, 1.0f), ec(cols, 1.0f), ir(rows, 1.0f),
        ic(cols, 1.0f), cs(cols);
    std::vector<double> col_raw(cols), row_raw(rows);  // std of X*ir per column, of X*ic per row

    // The identity is the first candidate.
    weighted_column_std(X, rows, cols, ir.data(), col_raw.data());
    weighted_row_std(X, rows, cols, ic.data(), row_raw.data());
    for (int j = 0; j < cols; ++j) cs[j] = (float)col_raw[j];
    double best = spread(col_raw.data(), ic.data(), cols) + spread(row_raw.data(), ir.data(), rows);
    std::fill(r, r + rows, 1.0f);
    std::fill(c, c + cols, 1.0f);

    for (int it = 0; it < iters; ++it) {
        // cs holds the column std of the current matrix (identity or last iteration).
        for (int j = 0; j < cols; ++j) {
            ec[j] = update_log_scale(lc[j], cs[j]);
            ic[j] = 1.0f / ec[j];
        }
        weighted_row_std(X, rows, cols, ic.data(), row_raw.data());
        for (int i = 0; i < rows; ++i) {
            er[i] = update_log_scale(lr[i], (float)(row_raw[i] * ir[i]));
            ir[i] = 1.0f / er[i];
        }
        weighted_column_std(X, rows, cols, ir.data(), col_raw.data());
        for (int j = 0; j < cols; ++j) cs[j] = (float)(col_raw[j] * ic[j]);
        const double imbalance = spread(col_raw.data(), ic.data(), cols) + spread(row_raw.data(), ir.data(), rows);
        if (imbalance <= best) {  // ties: the later candidate wins
            best = imbalance;
            std::copy(er.begin(), er.end(), r);
            std::copy(ec.begin(), ec.end(), c);
        }
    }
}

}  // namespace kvarn
