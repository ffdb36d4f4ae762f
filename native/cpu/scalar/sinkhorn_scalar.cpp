// Sinkhorn-style balancing, SPEC §3. The statistics use two identities so that
// an iteration reads the tile twice instead of materialising X / (r ⊗ c) twice
// and reading it three times:
//   std over rows of X[i][j] / c[j] / r[i]  =  (1/c[j]) · std_i(X[i][j] · (1/r[i]))
//   std over cols of X[i][j] / c[j] / r[i]  =  (1/r[i]) · std_j(X[i][j] · (1/c[j]))
// and the row statistic after the row update is the one computed just before it,
// times the new 1/r (the columns' scales did not change in between). The result
// equals SPEC's order of operations up to float rounding (a few ulp in the
// scales; tests compare with a float64 oracle).
//
// SIMD kernels (quantize_simd.inc) reproduce this file bit for bit, so every
// operation here is one they can do lane by lane in the same order:
// - statistics: one pass of float sums (Σy, Σy² in index order; y² is added by a
//   fused multiply-add, one rounding: the SIMD kernels' vfmadd, one instruction fewer per element;
//   in a baseline x86-64 build std::fma is a libm call, ~2.4x this file's quantiser time, paid only
//   where no SIMD kernel runs or KVARN_ISA=scalar),
//   finished in double; a sum whose mean dominates (see kvarn_cancel_fraction)
//   is redone in double (weighted_std_double);
// - log and exp: the small polynomials below (plain IEEE mul/add/div, no libm),
//   accurate to a few ulp over the clamped ranges they see.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvarn/format.h"
#include "sinkhorn.h"

namespace kvarn {

double weighted_std_double(const float* x, ptrdiff_t stride, const float* w, int n)
{
    double sum = 0.0, sum_sq = 0.0;
    for (int k = 0; k < n; ++k) {
        const double y = x[k * stride] * w[k];
        sum += y;
        sum_sq += y * y;
    }
    const double mean = sum / n;
    return std::sqrt(std::max((sum_sq - sum * mean) / (n - 1), 0.0));
}

namespace {

// Unbiased std of n values from their float sum and sum of squares, or nan when
// the float sums cannot be trusted (the caller then takes the double path).
double std_from_float_sums(float sum, float sum_sq, int n)
{
    // Multiplications by 1/n and 1/(n-1) (exact for n a power of two, < 1 ulp otherwise):
    // the SIMD lanes avoid two slow double divisions per statistic.
    const double s = sum, q = sum_sq;
    const double mean = s * (1.0 / n);
    const double dev = q - s * mean;  // Σ(y - mean)²
    if (!(dev >= kvarn_cancel_fraction * q) || !(q <= FLT_MAX)) return NAN;
    return std::sqrt(dev * (1.0 / (n - 1)));
}

// out[j] = std over i of X[i][j] * w[i]   (each column, rows weighted)
void weighted_column_std(const float* X, int rows, int cols, const float* w, double* out)
{
    std::vector<float> sum(cols, 0.0f), sum_sq(cols, 0.0f);
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
            const float y = X[(size_t)i * cols + j] * w[i];
            sum[j] += y;
            sum_sq[j] = std::fma(y, y, sum_sq[j]);
        }
    for (int j = 0; j < cols; ++j) {
        out[j] = std_from_float_sums(sum[j], sum_sq[j], rows);
        if (std::isnan(out[j])) out[j] = weighted_std_double(X + j, cols, w, rows);
    }
}

// out[i] = std over j of X[i][j] * w[j]   (each row, columns weighted)
void weighted_row_std(const float* X, int rows, int cols, const float* w, double* out)
{
    for (int i = 0; i < rows; ++i) {
        const float* row = X + (size_t)i * cols;
        float sum = 0.0f, sum_sq = 0.0f;
        for (int j = 0; j < cols; ++j) {
            const float y = row[j] * w[j];
            sum += y;
            sum_sq = std::fma(y, y, sum_sq);
        }
        out[i] = std_from_float_sums(sum, sum_sq, cols);
        if (std::isnan(out[i])) out[i] = weighted_std_double(row, 1, w, cols);
    }
}

float bits_to_float(uint32_t b)
{
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// log(x) for x in [KVARN_STD_MIN, KVARN_STD_MAX]: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, series to s^9 (error < 2e-8).
float log_poly(float x)
{
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    int e = (int)(bits >> 23) - 127;
    float m = bits_to_float((bits & 0x7fffffu) | 0x3f800000u);
    if (m > 1.41421356f) {
        m = m * 0.5f;
        e = e + 1;
    }
    const float f = m - 1.0f;
    const float s = f / (f + 2.0f);
    const float z = s * s;
    const float p = (((0.222222222f * z + 0.285714286f) * z + 0.4f) * z + 0.666666667f) * z + 2.0f;
    const float fe = (float)e;
    return (s * p + fe * -2.12194440e-4f) + fe * 0.693359375f;
}

// exp(x) for x in [KVARN_LOG_SCALE_MIN, KVARN_LOG_SCALE_MAX]: x = n ln2 + r (Cody-Waite),
// |r| <= ln2/2, degree-6 polynomial (Cephes expf), times 2^n.
float exp_poly(float x)
{
    const float n = std::nearbyint(x * 1.44269504f);
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = (y * (r * r) + r) + 1.0f;
    return y * bits_to_float((uint32_t)((int)n + 127) << 23);
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
    log_scale = clampf(log_scale + log_poly(clampf(std, KVARN_STD_MIN, KVARN_STD_MAX)), KVARN_LOG_SCALE_MIN,
                       KVARN_LOG_SCALE_MAX);
    return exp_poly(log_scale);
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
