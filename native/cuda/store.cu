// Input checks, token writes into the fp16 sink/tail, and the store kernel:
// Hadamard, dual-axis balancing, RTN and packing of full tiles into SPEC §6
// records. The store kernel follows native/cpu/scalar (the spec) operation by
// operation -- the same butterflies, the factorised balancing statistics (float
// sums in the CPU's order, finished in double, the double fallback where the mean
// dominates), the CPU's polynomial log/exp, the spread in double, B = (X * 1/c[col])
// * 1/r[row], (b - lo) / scale divided exactly, round-half-even -- with explicit roundings
// where nvcc would contract into an FMA, so its records are the CPU's bytes
// (tests/test_cuda.py checks them for equality).
#include <cfloat>
#include <cmath>

#include "common.cuh"

namespace kvarn_cuda {
namespace {

constexpr int kStoreThreads = 1024;  // one CTA per (tile, head, K|V): all warps load, rotate and pack
constexpr int kStoreWarps = kStoreThreads / 32;
constexpr int kInputFlags = KVARN_FLAG_K_NONFINITE | KVARN_FLAG_V_NONFINITE | KVARN_FLAG_K_RANGE | KVARN_FLAG_V_RANGE;

struct CheckSet {
    Strided4 x[KVARN_CUDA_MAX_CHECKS];
    int64_t n[KVARN_CUDA_MAX_CHECKS];
    int bit_nonfinite[KVARN_CUDA_MAX_CHECKS], bit_range[KVARN_CUDA_MAX_CHECKS];
};

__device__ void check_elements(const Strided4& x, int64_t n, int* flag, int bit_nonfinite, int bit_range)
{
    bool nonfinite = false, range = false;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i;
        const int64_t i3 = r % x.shape[3];
        r /= x.shape[3];
        const int64_t i2 = r % x.shape[2];
        r /= x.shape[2];
        const int64_t i1 = r % x.shape[1];
        const int64_t i0 = r / x.shape[1];
        const float val =
            load_elem(x.ptr, x.dtype, i0 * x.stride[0] + i1 * x.stride[1] + i2 * x.stride[2] + i3 * x.stride[3]);
        if (!isfinite(val))
            nonfinite = true;
        else if (fabsf(val) > 65504.0f)
            range = true;
    }
    const bool any_nf = __any_sync(0xffffffffu, nonfinite);
    const bool any_r = __any_sync(0xffffffffu, range);
    if ((threadIdx.x & 31) == 0) {
        if (any_nf) atomicOr(flag, bit_nonfinite);
        if (any_r && bit_range) atomicOr(flag, bit_range);
    }
}

// One launch for a step's q, k and v (a launch costs the host microseconds): tensor blockIdx.y.
__global__ void check_many_kernel(CheckSet set, int* flag)
{
    const int i = blockIdx.y;
    check_elements(set.x[i], set.n[i], flag, set.bit_nonfinite[i], set.bit_range[i]);
}

struct WriteArgs {
    kvarn_cuda_cache c;
    int layer;
    Strided4 k, v;  // [B, T, Hk, D]
    const int* meta;  // [B][3] slot, length before, first_tail
    const int* flag;
};

// One block per (b, t, head); threads over channels.
// Runs after the store kernel: the tail rows a completed tile reads must not be
// overwritten first, and a rejected append (any flag) must leave sink and tail as they were.
__global__ void write_tokens_kernel(WriteArgs a)
{
    if (*a.flag) return;
    const int Hk = a.c.num_kv_heads, D = a.c.head_dim, G = a.c.group;
    const int64_t T = a.k.shape[1];
    const int h = blockIdx.x % Hk;
    const int64_t bt = blockIdx.x / Hk;
    const int t = (int)(bt % T), b = (int)(bt / T);
    const int slot = a.meta[3 * b], len0 = a.meta[3 * b + 1], first_tail = a.meta[3 * b + 2];
    const int64_t pos = (int64_t)len0 + t;
    __half* dk;
    __half* dv;
    const int64_t head = ((int64_t)a.layer * a.c.num_slots + slot) * Hk + h;
    if (pos < a.c.sink_cap) {
        const int64_t off = (head * a.c.sink_cap + pos) * D;
        dk = reinterpret_cast<__half*>(a.c.sink_k) + off;
        dv = reinterpret_cast<__half*>(a.c.sink_v) + off;
    } else if (pos >= first_tail) {
        const int64_t off = (head * G + (pos - a.c.sink_cap) % G) * D;
        dk = reinterpret_cast<__half*>(a.c.tail_k) + off;
        dv = reinterpret_cast<__half*>(a.c.tail_v) + off;
    } else {
        return;  // reaches its tile straight from the input (store kernel)
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const int64_t ik = b * a.k.stride[0] + t * a.k.stride[1] + h * a.k.stride[2] + d * a.k.stride[3];
        const int64_t iv = b * a.v.stride[0] + t * a.v.stride[1] + h * a.v.stride[2] + d * a.v.stride[3];
        dk[d] = __float2half_rn(load_elem(a.k.ptr, a.k.dtype, ik));
        dv[d] = __float2half_rn(load_elem(a.v.ptr, a.v.dtype, iv));
    }
}

struct StoreArgs {
    kvarn_cuda_cache c;
    RecordLayout L;
    Strided4 k, v;
    const int* jobs;  // [n_jobs][7]
    int iters;
    int round_f16;
    int* flag;
};

__device__ __forceinline__ float clampf(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }

// The tile matrix X of SPEC §3 over the rotated tile T[token][channel] (row stride ld):
// K: rows = channels, cols = tokens; V: rows = tokens, cols = channels.
struct TileMatrix {
    const float* T;
    int ld, rows, cols;
    bool is_k;
    __device__ __forceinline__ float x(int i, int j) const { return is_k ? T[j * ld + i] : T[i * ld + j]; }
};

// The statistics and log/exp of native/cpu/scalar/sinkhorn_scalar.cpp, operation for operation
// (explicit roundings: nvcc would otherwise contract the CPU's separate a * b + c into FMAs; its one
// fused step, y * y into sum_sq, is written as one).
//
// Unbiased std over k < n of y = X(k) * w[k] (float products), as weighted_*_std there: float
// sums sum += y, sum_sq = fma(y, y, sum_sq) in k order, finished in double; where the mean dominates
// (dev < q / 8) or sum_sq overflows, redone with sums in double (weighted_std_double). One
// thread per column or row: the sums' order is the CPU's, so the result is bit-identical.
// recip: 1/rows, 1/(rows - 1), 1/cols, 1/(cols - 1) (double, computed once per block).
template <bool COL, bool ISK>
__device__ __forceinline__ double weighted_std_t(const TileMatrix& m, int o, const float* w, const double* recip)
{
    const int n = COL ? m.rows : m.cols;
    // X[i,j] = T[j * ld + i] (K) or T[i * ld + j] (V); element (k, o) of the walk.
    const bool k_major = COL != ISK;  // element k at T[k * ld + o], else T[o * ld + k]
    const float* p = m.T + (k_major ? o : o * m.ld);
    const int step = k_major ? m.ld : 1;
    float sum = 0.0f, sum_sq = 0.0f;
#pragma unroll 8
    for (int k = 0; k < n; ++k) {
        const float y = __fmul_rn(p[k * step], w[k]);
        sum = __fadd_rn(sum, y);
        sum_sq = __fmaf_rn(y, y, sum_sq);  // fused, as the CPU's
    }
    {
        // Multiplications by 1/n and 1/(n-1), as the CPU since 1d232ed (exact for n a power of two).
        const double sd = sum, q = sum_sq;
        const double mean = __dmul_rn(sd, recip[COL ? 0 : 2]);
        const double dev = __dsub_rn(q, __dmul_rn(sd, mean));  // sum of (y - mean)^2
        if (dev >= 0.125 * q && q <= (double)FLT_MAX) return sqrt(__dmul_rn(dev, recip[COL ? 1 : 3]));
    }
    double sd = 0.0, q = 0.0;  // the double fallback
    for (int k = 0; k < n; ++k) {
        const double y = (double)__fmul_rn(p[k * step], w[k]);
        sd = __dadd_rn(sd, y);
        q = __dadd_rn(q, __dmul_rn(y, y));
    }
    const double mean = __ddiv_rn(sd, (double)n);
    const double var = __ddiv_rn(__dsub_rn(q, __dmul_rn(sd, mean)), (double)(n - 1));
    return sqrt(var > 0.0 ? var : 0.0);
}

// Column o's std (over rows) of X * w[row] (col_stats), or row o's (over columns) of X * w[col].
__device__ __forceinline__ double weighted_std(const TileMatrix& m, bool col_stats, int o, const float* w,
                                               const double* recip)
{
    if (col_stats)
        return m.is_k ? weighted_std_t<true, true>(m, o, w, recip) : weighted_std_t<true, false>(m, o, w, recip);
    return m.is_k ? weighted_std_t<false, true>(m, o, w, recip) : weighted_std_t<false, false>(m, o, w, recip);
}

// Min and max of v over the threads [first, first + n) (n and first multiples of 32): per-warp
// results in mm[2 w], mm[2 w + 1], w = (thread - first) / 32; read them after a barrier.
__device__ __forceinline__ void warp_minmax(double v, int first, int n, double* mm)
{
    const int t = (int)threadIdx.x - first;
    if (t < 0 || t >= n) return;
    double lo = v, hi = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        lo = fmin(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmax(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    if ((t & 31) == 0) {
        mm[2 * (t >> 5)] = lo;
        mm[2 * (t >> 5) + 1] = hi;
    }
}

// The CPU's spread: max / max(min, eps) of n values (from warp_minmax's results), in double
// (near convergence, candidates differ by less than a float ulp).
__device__ __forceinline__ double spread_of(const double* mm, int n)
{
    double lo = mm[0], hi = mm[1];
    for (int w = 1; w < (n >> 5); ++w) {
        lo = fmin(lo, mm[2 * w]);
        hi = fmax(hi, mm[2 * w + 1]);
    }
    return __ddiv_rn(hi, fmax(lo, (double)1e-8f));
}

// log_poly / exp_poly of the CPU: log(x) for x in [1e-3, 1e3] (x = m 2^e, m in [sqrt(1/2),
// sqrt(2)), 2 atanh series to s^9) and exp(x) for x in [-0.3, 10] (Cody-Waite, Cephes expf
// polynomial, times 2^n), in plain IEEE float operations in the CPU's order.
__device__ __forceinline__ float log_poly(float x)
{
    const uint32_t bits = __float_as_uint(x);
    int e = (int)(bits >> 23) - 127;
    float m = __uint_as_float((bits & 0x7fffffu) | 0x3f800000u);
    if (m > 1.41421356f) {
        m = __fmul_rn(m, 0.5f);
        e = e + 1;
    }
    const float f = __fsub_rn(m, 1.0f);
    const float s = __fdiv_rn(f, __fadd_rn(f, 2.0f));
    const float z = __fmul_rn(s, s);
    float p = __fadd_rn(__fmul_rn(0.222222222f, z), 0.285714286f);
    p = __fadd_rn(__fmul_rn(p, z), 0.4f);
    p = __fadd_rn(__fmul_rn(p, z), 0.666666667f);
    p = __fadd_rn(__fmul_rn(p, z), 2.0f);
    const float fe = (float)e;
    return __fadd_rn(__fadd_rn(__fmul_rn(s, p), __fmul_rn(fe, -2.12194440e-4f)), __fmul_rn(fe, 0.693359375f));
}

__device__ __forceinline__ float exp_poly(float x)
{
    const float n = rintf(__fmul_rn(x, 1.44269504f));  // nearbyint: ties to even
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693359375f)), __fmul_rn(n, -2.12194440e-4f));
    float y = 1.9875691500e-4f;
    y = __fadd_rn(__fmul_rn(y, r), 1.3981999507e-3f);
    y = __fadd_rn(__fmul_rn(y, r), 8.3334519073e-3f);
    y = __fadd_rn(__fmul_rn(y, r), 4.1665795894e-2f);
    y = __fadd_rn(__fmul_rn(y, r), 1.6666665459e-1f);
    y = __fadd_rn(__fmul_rn(y, r), 5.0000001201e-1f);
    y = __fadd_rn(__fadd_rn(__fmul_rn(y, __fmul_rn(r, r)), r), 1.0f);
    return __fmul_rn(y, __uint_as_float((uint32_t)((int)n + 127) << 23));
}

// The CPU's update_log_scale: log_scale += log(clamped std), clamped; returns exp(log_scale).
__device__ __forceinline__ float update_log_scale(float& log_scale, float std)
{
    log_scale = clampf(__fadd_rn(log_scale, log_poly(clampf(std, 1e-3f, 1e3f))), -0.3f, 10.0f);
    return exp_poly(log_scale);
}

__device__ __forceinline__ uint16_t to_half_bits(float x, bool& finite)
{
    const __half h = __float2half_rn(x);
    const uint16_t bits = __half_as_ushort(h);
    if ((bits & 0x7c00u) == 0x7c00u) finite = false;
    return bits;
}

struct RowSource {
    const Strided4& src;
    const __half* tail;  // [G][D] fp16, rows < n_old
    int n_old, b, h, t0;
    bool round_f16;
    __device__ __forceinline__ float at(int t, int d, int D) const
    {
        if (t < n_old) return __half2float(tail[t * D + d]);
        float x = load_elem(src.ptr, src.dtype,
                            b * src.stride[0] + (int64_t)(t0 + t - n_old) * src.stride[1] + h * src.stride[2] +
                                d * src.stride[3]);
        return round_f16 ? __half2float(__float2half_rn(x)) : x;
    }
};

// Rows t of the tile (D = 32 * E channels; lane holds channels [E * lane, E * lane + E)), NR
// rows per warp at a time: load, the spec's butterflies in the same order (h = 1, 2, 4, ...:
// x0 + x1 at the lower index, x0 - x1 at the upper), the norm, into T[t * ld + d].
template <int E>
__device__ __forceinline__ void load_rotate_rows(const RowSource& in, int G, float* T, int ld)
{
    constexpr int D = 32 * E, NR = E >= 8 ? 1 : 2;  // rows per warp at a time (register budget)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float norm = (float)(1.0 / sqrt((double)D));
    for (int t = warp; t < G; t += NR * kStoreWarps) {
        float v[NR][E];
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int e = 0; e < E; ++e) v[r][e] = t + r * kStoreWarps < G ? in.at(t + r * kStoreWarps, E * lane + e, D) : 0.0f;
#pragma unroll
        for (int r = 0; r < NR; ++r) {
#pragma unroll
            for (int hh = 1; hh < E; hh <<= 1)
#pragma unroll
                for (int e = 0; e < E; ++e)
                    if ((e & hh) == 0) {
                        const float x0 = v[r][e], x1 = v[r][e + hh];
                        v[r][e] = x0 + x1;
                        v[r][e + hh] = x0 - x1;
                    }
#pragma unroll
            for (int mk = 1; mk < 32; mk <<= 1) {
                const bool upper = lane & mk;
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    const float other = __shfl_xor_sync(0xffffffffu, v[r][e], mk);
                    v[r][e] = upper ? other - v[r][e] : v[r][e] + other;
                }
            }
            if (t + r * kStoreWarps < G)
#pragma unroll
                for (int e = 0; e < E; ++e) T[(t + r * kStoreWarps) * ld + E * lane + e] = v[r][e] * norm;
        }
    }
}

// Grid: (n_jobs * Hk, 2): blockIdx.y 0 quantises K, 1 quantises V of one (tile, head).
__global__ void __launch_bounds__(kStoreThreads) store_kernel(StoreArgs a)
{
    const int Hk = a.c.num_kv_heads, D = a.c.head_dim, G = a.c.group;
    const int job = blockIdx.x / Hk, h = blockIdx.x % Hk;
    const bool is_k = blockIdx.y == 0;
    const int* jb = a.jobs + 7 * job;
    const int slot = jb[0], layer = jb[1], page = jb[2], b = jb[3], n_old = jb[4], t0 = jb[5], tile_index = jb[6];
    // The block-table entry even for a batch the checks flagged: with deferred checks (append_attend's flags=)
    // the step's attend still reads the tile (its output is thrown away once the flags are read), and must find a
    // page of the pool there, not the entry's stale value.
    if (a.c.block_table && is_k && h == 0 && threadIdx.x == 0)
        reinterpret_cast<int*>(a.c.block_table)[(int64_t)slot * a.c.max_tiles + tile_index] = page;
    if (*a.flag & kInputFlags) return;
    const int ld = D + 1;  // odd stride: row and column walks are both free of bank conflicts
    const int nv = G > D ? G : D;

    extern __shared__ double smem_d[];
    double* mmc = smem_d;                // per-warp min/max of the column stds [2 * 8]
    double* mmr = mmc + 16;              // and of the row stds
    double* recip = mmr + 16;            // 1/rows, 1/(rows-1), 1/cols, 1/(cols-1)
    float* T = reinterpret_cast<float*>(recip + 4);
    float* ir = T + G * ld;  // 1 / er, 1 / ec: the statistics' weights
    float* ic = ir + nv;
    float* rb = ic + nv;  // best r
    float* cb = rb + nv;  // best c
    float* rlo = cb + nv;
    float* rsc = rlo + nv;

    // 1-2. Load (old rows from the fp16 tail, new rows from the input) and rotate each token row
    // (Walsh-Hadamard over the whole row -- the served head dims are powers of two -- then the
    // 1/sqrt(D) norm) in registers, one warp per row, the butterflies across lanes by shuffles.
    const Strided4& src = is_k ? a.k : a.v;
    const __half* tail = reinterpret_cast<const __half*>(is_k ? a.c.tail_k : a.c.tail_v) +
                         (((int64_t)layer * a.c.num_slots + slot) * Hk + h) * G * D;
    const RowSource rs_src{src, tail, n_old, b, h, t0, a.round_f16 != 0};
    if (D == 64)
        load_rotate_rows<2>(rs_src, G, T, ld);
    else if (D == 128)
        load_rotate_rows<4>(rs_src, G, T, ld);
    else
        load_rotate_rows<8>(rs_src, G, T, ld);

    // 3. Balance (SPEC §3) as native/cpu/scalar/sinkhorn_scalar.cpp does it: factorised
    // statistics (column j's std of X / ec / er is std_i(X[i,j] ir[i]) ic[j], likewise rows),
    // two passes over X per iteration, the spread in double, ties to the later candidate.
    // Column j is owned by thread j, row i by thread kRowOwner + i: their log scales (lc, lr),
    // scales and the statistics' weights live in the owners' registers; ic / ir are shared for
    // the passes. Same operations in the same order as the CPU: bit-identical scales.
    constexpr int kRowOwner = kStoreThreads / 2;
    TileMatrix m{T, ld, is_k ? D : G, is_k ? G : D, is_k};
    const int t = threadIdx.x;
    const bool own_c = t < m.cols, own_r = t >= kRowOwner && t < kRowOwner + m.rows;
    const int oi = t - kRowOwner;  // the owned row
    for (int i = t; i < nv; i += kStoreThreads) ir[i] = ic[i] = 1.0f;
    if (t < 4) {
        const int n = t < 2 ? m.rows : m.cols;
        recip[t] = __ddiv_rn(1.0, (double)(t % 2 == 0 ? n : n - 1));
    }
    __syncthreads();
    float lc = 0.0f, ec = 1.0f, icc = 1.0f, cs = 0.0f;  // column owners
    float lr = 0.0f, er = 1.0f, irr = 1.0f;             // row owners
    float cbest = 1.0f, rbest = 1.0f;
    // The identity is the first candidate (column and row statistics at once).
    if (own_c) {
        const double raw = weighted_std(m, true, t, ir, recip);
        cs = (float)raw;
        warp_minmax(raw, 0, m.cols, mmc);
    }
    if (own_r) warp_minmax(weighted_std(m, false, oi, ic, recip), kRowOwner, m.rows, mmr);
    __syncthreads();
    double best = __dadd_rn(spread_of(mmc, m.cols), spread_of(mmr, m.rows));
    for (int it = 0; it < a.iters; ++it) {
        if (own_c) {
            ec = update_log_scale(lc, cs);
            icc = __fdiv_rn(1.0f, ec);
            ic[t] = icc;
        }
        __syncthreads();
        if (own_r) {
            const double raw = weighted_std(m, false, oi, ic, recip);  // rows of X * ic
            er = update_log_scale(lr, (float)__dmul_rn(raw, (double)irr));  // with the old ir
            irr = __fdiv_rn(1.0f, er);
            ir[oi] = irr;
            warp_minmax(__dmul_rn(raw, (double)irr), kRowOwner, m.rows, mmr);  // the new ir: no new pass
        }
        __syncthreads();
        if (own_c) {
            const double raw = weighted_std(m, true, t, ir, recip);  // columns of X * ir
            const double s = __dmul_rn(raw, (double)icc);
            cs = (float)s;
            warp_minmax(s, 0, m.cols, mmc);
        }
        __syncthreads();
        const double imbalance = __dadd_rn(spread_of(mmc, m.cols), spread_of(mmr, m.rows));
        if (imbalance <= best) {  // ties: the later candidate wins (uniform across the block)
            best = imbalance;
            cbest = ec;
            rbest = er;
        }
    }
    // The best scales and their reciprocals (the CPU forms B = X * (1/c) * (1/r), 1af511e).
    if (own_c) {
        cb[t] = cbest;
        ic[t] = __fdiv_rn(1.0f, cbest);
    }
    if (own_r) {
        rb[oi] = rbest;
        ir[oi] = __fdiv_rn(1.0f, rbest);
    }
    __syncthreads();

    // 4. RTN per row of the balanced matrix B = (X * (1/c[col])) * (1/r[row]) (as the CPU: two
    // products, not divisions), codes round((b - lo) / scale) with the exact division; folded
    // fp16 vectors.
    const int bits = is_k ? a.c.kbits : a.c.vbits;
    const float qmax = (float)((1 << bits) - 1);
    uint8_t* rec = reinterpret_cast<uint8_t*>(a.c.pool) +
                   (((int64_t)layer * a.c.num_pages + page) * Hk + h) * a.L.total;
    uint16_t* fa = reinterpret_cast<uint16_t*>(rec + (is_k ? a.L.ka : a.L.va));
    uint16_t* fz = reinterpret_cast<uint16_t*>(rec + (is_k ? a.L.kz : a.L.vz));
    uint16_t* fc = reinterpret_cast<uint16_t*>(rec + (is_k ? a.L.kt : a.L.vc));
    uint8_t* codes = rec + (is_k ? a.L.k_codes : a.L.v_codes);
    bool finite = true;
    {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int i = warp; i < m.rows; i += kStoreWarps) {
            float lo = INFINITY, hi = -INFINITY;
            for (int j = lane; j < m.cols; j += 32) {
                const float bval = __fmul_rn(__fmul_rn(m.x(i, j), ic[j]), ir[i]);
                lo = fminf(lo, bval);
                hi = fmaxf(hi, bval);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
                hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
            }
            lo = __fadd_rn(lo, 0.0f);  // -0 -> +0, as the CPU kernels: which zero fminf keeps is unspecified
            const float scale = fmaxf(__fdiv_rn(__fsub_rn(hi, lo), qmax), 1e-10f);
            if (lane == 0) {
                rlo[i] = lo;
                rsc[i] = scale;
                fa[i] = to_half_bits(__fmul_rn(rb[i], scale), finite);
                fz[i] = to_half_bits(__fmul_rn(rb[i], lo), finite);
            }
        }
        for (int j = threadIdx.x; j < m.cols; j += kStoreThreads) fc[j] = to_half_bits(cb[j], finite);
    }
    __syncthreads();
    // Keys: each token's squared norm as decoded, (code * ka + kz)^2 summed over channels, into rb
    // (free now: the fp16 vectors are written). The attention kernels cannot report an overflow, and
    // the query check assumes norms below sqrt(D) * 2^17: extreme inputs (+-65504 spikes) can decode
    // beyond it, and such a tile is refused (the CPU path accepts it and raises at attend).
    float* col_sq = rb;
    if (is_k) {
        for (int j = threadIdx.x; j < m.cols; j += kStoreThreads) col_sq[j] = 0.0f;
        __syncthreads();
    }
    const int per_byte = 8 / bits;
    const int row_bytes = m.cols / per_byte;
    // A thread's byte column (idx % row_bytes) is the same in every row when kStoreThreads is a
    // multiple of row_bytes (16..128 for every preset): its tokens' squares then add up in registers
    // and reach shared memory once, not as one shared atomic per code.
    const bool same_columns = kStoreThreads % row_bytes == 0;
    float sq[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // per_byte <= 4 for K (kbits >= 2)
    for (int idx = threadIdx.x; idx < m.rows * row_bytes; idx += kStoreThreads) {
        const int i = idx / row_bytes, jb0 = (idx % row_bytes) * per_byte;
        const float lo = rlo[i], scale = rsc[i], inv_r = ir[i];
        const float ka = is_k ? __half2float(__ushort_as_half(fa[i])) : 0.0f;
        const float kz = is_k ? __half2float(__ushort_as_half(fz[i])) : 0.0f;
        unsigned byte = 0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {  // constant bounds: sq[] stays in registers
            if (e >= per_byte) break;
            const int j = jb0 + e;
            const float bval = __fmul_rn(__fmul_rn(m.x(i, j), ic[j]), inv_r);
            const float c = clampf(rintf(__fdiv_rn(__fsub_rn(bval, lo), scale)), 0.0f, qmax);
            byte |= (unsigned)c << (e * bits);
            if (is_k) {
                const float key = fmaf(c, ka, kz);
                if (same_columns && e < 4)
                    sq[e] = fmaf(key, key, sq[e]);
                else
                    atomicAdd(&col_sq[j], key * key);
            }
        }
        codes[idx] = (uint8_t)byte;
    }
    if (is_k) {
        if (same_columns && threadIdx.x < m.rows * row_bytes) {
            const int jb0 = (threadIdx.x % row_bytes) * per_byte;
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (e < per_byte) atomicAdd(&col_sq[jb0 + e], sq[e]);
        }
        __syncthreads();
        const float limit_sq = (float)D * 17179869184.0f;  // (sqrt(D) * 2^17)^2
        for (int j = threadIdx.x; j < m.cols; j += kStoreThreads) {
            const float kt = __half2float(__ushort_as_half(fc[j]));
            if (!(col_sq[j] * kt * kt <= limit_sq)) atomicOr(a.flag, KVARN_FLAG_KEY_NORM);
        }
    }
    if (!finite) atomicOr(a.flag, is_k ? KVARN_FLAG_K_SCALE_OVERFLOW : KVARN_FLAG_V_SCALE_OVERFLOW);
}

size_t store_smem_bytes(int G, int D)
{
    const int nv = G > D ? G : D;
    return sizeof(double) * 36 + sizeof(float) * ((size_t)G * (D + 1) + 6 * (size_t)nv);
}

}  // namespace
}  // namespace kvarn_cuda

using namespace kvarn_cuda;

extern "C" int kvarn_cuda_check_many(const kvarn_cuda_tensor* xs, const int32_t* bits, int32_t count, uintptr_t flag,
                                     uintptr_t stream)
{
    if (!xs || !bits || !flag || count < 1 || count > KVARN_CUDA_MAX_CHECKS) return KVARN_CUDA_ERR_ARGUMENT;
    CheckSet set = {};
    int64_t most = 0;
    for (int i = 0; i < count; ++i) {
        if (xs[i].ndim < 1 || xs[i].ndim > 4) return KVARN_CUDA_ERR_ARGUMENT;
        set.x[i] = as_strided4(xs[i]);
        set.n[i] = 1;
        for (int d = 0; d < 4; ++d) set.n[i] *= set.x[i].shape[d];
        set.bit_nonfinite[i] = bits[2 * i];
        set.bit_range[i] = bits[2 * i + 1];
        most = set.n[i] > most ? set.n[i] : most;
    }
    if (most == 0) return KVARN_CUDA_OK;
    const int threads = 256;
    const int64_t blocks = (most + threads - 1) / threads;
    const dim3 grid((unsigned)(blocks < 4096 ? blocks : 4096), (unsigned)count);
    check_many_kernel<<<grid, threads, 0, (cudaStream_t)stream>>>(set, reinterpret_cast<int*>(flag));
    KVARN_CUDA_TRY(cudaGetLastError(), "check kernel launch");
    return KVARN_CUDA_OK;
}

extern "C" int kvarn_cuda_write_tokens(const kvarn_cuda_cache* c, int32_t layer, const kvarn_cuda_tensor* k,
                                       const kvarn_cuda_tensor* v, uintptr_t meta, int32_t batch, uintptr_t flag,
                                       uintptr_t stream)
{
    if (!c || !k || !v || !meta || !flag || k->ndim != 4 || v->ndim != 4 || batch <= 0) return KVARN_CUDA_ERR_ARGUMENT;
    WriteArgs a;
    a.c = *c;
    a.layer = layer;
    a.k = as_strided4(*k);
    a.v = as_strided4(*v);
    a.meta = reinterpret_cast<const int*>(meta);
    a.flag = reinterpret_cast<const int*>(flag);
    const int64_t blocks = (int64_t)batch * k->shape[1] * c->num_kv_heads;
    if (blocks == 0) return KVARN_CUDA_OK;
    if (blocks > 0x7fffffff) return KVARN_CUDA_ERR_ARGUMENT;
    const int threads = c->head_dim < 256 ? c->head_dim : 256;
    write_tokens_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(a);
    KVARN_CUDA_TRY(cudaGetLastError(), "write_tokens kernel launch");
    return KVARN_CUDA_OK;
}

extern "C" int kvarn_cuda_store(const kvarn_cuda_cache* c, const kvarn_cuda_tensor* k, const kvarn_cuda_tensor* v,
                                uintptr_t jobs, int32_t n_jobs, int32_t iters, int32_t round_f16, uintptr_t flag,
                                uintptr_t stream)
{
    if (!c || !k || !v || !jobs || !flag || n_jobs < 0 || iters < 0) return KVARN_CUDA_ERR_ARGUMENT;
    if (!kvarn_cuda_format_supported(c->kbits, c->vbits, c->group, c->head_dim)) return KVARN_CUDA_ERR_ARGUMENT;
    if ((int64_t)n_jobs * c->num_kv_heads > 0x7fffffff) return KVARN_CUDA_ERR_ARGUMENT;  // the grid's x dimension
    if (n_jobs == 0) return KVARN_CUDA_OK;
    StoreArgs a;
    a.c = *c;
    a.L = record_layout(c->kbits, c->vbits, c->group, c->head_dim);
    a.k = as_strided4(*k);
    a.v = as_strided4(*v);
    a.jobs = reinterpret_cast<const int*>(jobs);
    a.iters = iters;
    a.round_f16 = round_f16;
    a.flag = reinterpret_cast<int*>(flag);
    const size_t smem = store_smem_bytes(c->group, c->head_dim);
    KVARN_CUDA_TRY(cudaFuncSetAttribute(store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   "store kernel shared memory");
    dim3 grid((unsigned)((int64_t)n_jobs * c->num_kv_heads), 2);
    store_kernel<<<grid, kStoreThreads, smem, (cudaStream_t)stream>>>(a);
    KVARN_CUDA_TRY(cudaGetLastError(), "store kernel launch");
    return KVARN_CUDA_OK;
}
