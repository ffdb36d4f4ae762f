// Sinkhorn-style balancing, exactly as SPEC §3 writes it. The O(rows*cols)
// passes divide in the spec's order (X / c[col] / r[row]) so that a vector
// version can reproduce the result bit for bit; means and variances
// accumulate in double (two-pass, unbiased).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvarn/format.h"
#include "sinkhorn.h"

namespace kvarn {
namespace {

void apply_scales(const float* X, int rows, int cols, const float* ec, const float* er, float* cur)
{
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) cur[(size_t)i * cols + j] = X[(size_t)i * cols + j] / ec[j] / er[i];
}

// Unbiased std of each column (over rows).
void column_std(const float* cur, int rows, int cols, float* out)
{
    std::vector<double> mean(cols, 0.0), ss(cols, 0.0);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) mean[j] += cur[(size_t)i * cols + j];
    for (int j = 0; j < cols; ++j) mean[j] /= rows;
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
            double d = cur[(size_t)i * cols + j] - mean[j];
            ss[j] += d * d;
        }
    for (int j = 0; j < cols; ++j) out[j] = (float)std::sqrt(ss[j] / (rows - 1));
}

// Unbiased std of each row (over columns).
void row_std(const float* cur, int rows, int cols, float* out)
{
    for (int i = 0; i < rows; ++i) {
        const float* row = cur + (size_t)i * cols;
        double mean = 0.0, ss = 0.0;
        for (int j = 0; j < cols; ++j) mean += row[j];
        mean /= cols;
        for (int j = 0; j < cols; ++j) {
            double d = row[j] - mean;
            ss += d * d;
        }
        out[i] = (float)std::sqrt(ss / (cols - 1));
    }
}

float spread(const float* s, int n)
{
    float lo = s[0], hi = s[0];
    for (int i = 1; i < n; ++i) {
        lo = std::min(lo, s[i]);
        hi = std::max(hi, s[i]);
    }
    return hi / std::max(lo, KVARN_IMBALANCE_EPS);
}

float clampf(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

}  // namespace

void sinkhorn_balance(const float* X, int rows, int cols, int iters, float* r, float* c)
{
    std::vector<float> lr(rows, 0.0f), lc(cols, 0.0f), er(rows, 1.0f), ec(cols, 1.0f);
    std::vector<float> cur(X, X + (size_t)rows * cols), cs(cols), rs(rows);

    // The identity is the first candidate.
    column_std(cur.data(), rows, cols, cs.data());
    row_std(cur.data(), rows, cols, rs.data());
    float best = spread(cs.data(), cols) + spread(rs.data(), rows);
    std::fill(r, r + rows, 1.0f);
    std::fill(c, c + cols, 1.0f);

    for (int it = 0; it < iters; ++it) {
        // cs holds the column std of the current matrix (from the identity or the last iteration).
        for (int j = 0; j < cols; ++j) {
            lc[j] = clampf(lc[j] + std::log(clampf(cs[j], KVARN_STD_MIN, KVARN_STD_MAX)),
                           KVARN_LOG_SCALE_MIN, KVARN_LOG_SCALE_MAX);
            ec[j] = std::exp(lc[j]);
        }
        apply_scales(X, rows, cols, ec.data(), er.data(), cur.data());
        row_std(cur.data(), rows, cols, rs.data());
        for (int i = 0; i < rows; ++i) {
            lr[i] = clampf(lr[i] + std::log(clampf(rs[i], KVARN_STD_MIN, KVARN_STD_MAX)),
                           KVARN_LOG_SCALE_MIN, KVARN_LOG_SCALE_MAX);
            er[i] = std::exp(lr[i]);
        }
        apply_scales(X, rows, cols, ec.data(), er.data(), cur.data());
        column_std(cur.data(), rows, cols, cs.data());
        row_std(cur.data(), rows, cols, rs.data());
        const float imbalance = spread(cs.data(), cols) + spread(rs.data(), rows);
        if (imbalance <= best) {  // ties: the later candidate wins
            best = imbalance;
            std::copy(er.begin(), er.end(), r);
            std::copy(ec.begin(), ec.end(), c);
        }
    }
}

}  // namespace kvarn
