// Does the scalar Sinkhorn reach a fixed point of its log scales before its last iteration (then later
// iterations could be skipped with identical records)? Per matrix: the first iteration whose (lc, lr) equal the
// previous one (-1: none), the first equal to the one two back (-1: none), and how many entries the last changed.
// Build from the repository root: g++ -O2 -std=c++17 -Iinclude -Inative/cpu/scalar -I. \
//   benchmarks/results/emr2c_s104/fixed_point.cpp -o /tmp/fixed_point; run where fixed_point_mats.py wrote mats.bin.
#include "native/cpu/scalar/sinkhorn_scalar.cpp"
#include <cstdio>
using namespace kvarn;
// Instrumented copy of sinkhorn_balance: reports the first iteration whose (lc, lr) equal the
// state one or two iterations back (period 1 or 2).
static void run(const float* X, int rows, int cols, int iters) {
    std::vector<float> lr(rows, 0.0f), lc(cols, 0.0f), er(rows, 1.0f), ec(cols, 1.0f), ir(rows, 1.0f), ic(cols, 1.0f), cs(cols);
    std::vector<double> col_raw(cols), row_raw(rows);
    weighted_column_std(X, rows, cols, ir.data(), col_raw.data());
    weighted_row_std(X, rows, cols, ic.data(), row_raw.data());
    for (int j = 0; j < cols; ++j) cs[j] = (float)col_raw[j];
    std::vector<std::vector<float>> hist;
    auto snap = [&]() { std::vector<float> s(lc); s.insert(s.end(), lr.begin(), lr.end()); return s; };
    hist.push_back(snap());
    int p1 = -1, p2 = -1;
    for (int it = 0; it < iters; ++it) {
        for (int j = 0; j < cols; ++j) { ec[j] = update_log_scale(lc[j], cs[j]); ic[j] = 1.0f / ec[j]; }
        weighted_row_std(X, rows, cols, ic.data(), row_raw.data());
        for (int i = 0; i < rows; ++i) { er[i] = update_log_scale(lr[i], (float)(row_raw[i] * ir[i])); ir[i] = 1.0f / er[i]; }
        weighted_column_std(X, rows, cols, ir.data(), col_raw.data());
        for (int j = 0; j < cols; ++j) cs[j] = (float)(col_raw[j] * ic[j]);
        hist.push_back(snap());
        size_t n = hist.size();
        if (p1 < 0 && hist[n - 1] == hist[n - 2]) p1 = it;
        if (p2 < 0 && n >= 3 && hist[n - 1] == hist[n - 3]) p2 = it;
    }
    int changed = 0; size_t n = hist.size();
    for (size_t k = 0; k < hist[n-1].size(); ++k) changed += hist[n-1][k] != hist[n-2][k];
    printf("%d %d %d\n", p1, p2, changed);
}
int main(int argc, char** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 8;
    FILE* f = fopen("mats.bin", "rb");
    int shape[2];
    while (fread(shape, 4, 2, f) == 2) {
        std::vector<float> m((size_t)shape[0] * shape[1]);
        fread(m.data(), 4, m.size(), f);
        run(m.data(), shape[0], shape[1], iters);
    }
}
