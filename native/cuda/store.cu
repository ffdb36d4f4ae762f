// Input checks, token writes into the fp16 sink/tail, and the store kernel:
// Hadamard, dual-axis balancing, RTN and packing of full tiles into SPEC §6
// records. The store kernel follows native/cpu/scalar (the spec) operation by
// operation in fp32 -- the same butterflies, X / c[col] / r[row] divisions in
// that order, round-half-even -- with the std reductions accumulated in double
// like the CPU, so records match the CPU's bit for bit except where a
// reduction's different summation order (one pass of sums and squares in double,
// a last-ulp log/exp) moves a value across a rounding boundary.
#include <cmath>

#include "common.cuh"

namespace kvarn_cuda {
namespace {

constexpr int kStoreThreads = 1024;  // one CTA per (tile, head, K|V): many warps hide the fp64/division latency
constexpr int kStoreWarps = kStoreThreads / 32;
constexpr int kInputFlags = KVARN_FLAG_K_NONFINITE | KVARN_FLAG_V_NONFINITE | KVARN_FLAG_K_RANGE | KVARN_FLAG_V_RANGE;

__global__ void check_kernel(Strided4 x, int64_t n, int* flag, int bit_nonfinite, int bit_range)
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

__device__ __forceinline__ double warp_sum_d(double x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float clampf(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }

// The tile matrix X of SPEC §3 over the rotated tile T[token][channel] (row stride ld):
// K: rows = channels, cols = tokens; V: rows = tokens, cols = channels.
struct TileMatrix {
    const float* T;
    int ld, rows, cols;
    bool is_k;
    __device__ __forceinline__ float x(int i, int j) const { return is_k ? T[j * ld + i] : T[i * ld + j]; }
};

// Unbiased std of each column j of X / ec[col] / er[row] (over rows), accumulated in double.
// One pass (sum and sum of squares): in double the cancellation costs far less than the
// float result's last bit, and it halves the divisions of the spec's two-pass form.
__device__ __forceinline__ float std_from_sums(double s, double ss, int n)
{
    const double var = (ss - s * s / n) / (n - 1);
    return (float)sqrt(var > 0.0 ? var : 0.0);
}

__device__ void column_std(const TileMatrix& m, const float* ec, const float* er, float* out)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int j = warp; j < m.cols; j += kStoreWarps) {
        double s = 0.0, ss = 0.0;
        for (int i = lane; i < m.rows; i += 32) {
            const double x = (double)(m.x(i, j) / ec[j] / er[i]);
            s += x;
            ss = fma(x, x, ss);
        }
        s = warp_sum_d(s);
        ss = warp_sum_d(ss);
        if (lane == 0) out[j] = std_from_sums(s, ss, m.rows);
    }
}

// Unbiased std of each row i (over columns).
__device__ void row_std(const TileMatrix& m, const float* ec, const float* er, float* out)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = warp; i < m.rows; i += kStoreWarps) {
        double s = 0.0, ss = 0.0;
        for (int j = lane; j < m.cols; j += 32) {
            const double x = (double)(m.x(i, j) / ec[j] / er[i]);
            s += x;
            ss = fma(x, x, ss);
        }
        s = warp_sum_d(s);
        ss = warp_sum_d(ss);
        if (lane == 0) out[i] = std_from_sums(s, ss, m.cols);
    }
}

// max(s) / max(min(s), eps), by one warp.
__device__ float warp_spread(const float* s, int n)
{
    const int lane = threadIdx.x & 31;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = lane; i < n; i += 32) {
        lo = fminf(lo, s[i]);
        hi = fmaxf(hi, s[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    return hi / fmaxf(lo, 1e-8f);
}

// log/exp in double, rounded once: the correctly rounded float in nearly all
// cases, as close to the CPU's logf/expf as a GPU gets.
__device__ __forceinline__ float logf_cr(float x) { return (float)log((double)x); }
__device__ __forceinline__ float expf_cr(float x) { return (float)exp((double)x); }

__device__ __forceinline__ uint16_t to_half_bits(float x, bool& finite)
{
    const __half h = __float2half_rn(x);
    const uint16_t bits = __half_as_ushort(h);
    if ((bits & 0x7c00u) == 0x7c00u) finite = false;
    return bits;
}

// Grid: (n_jobs * Hk, 2): blockIdx.y 0 quantises K, 1 quantises V of one (tile, head).
__global__ void __launch_bounds__(kStoreThreads) store_kernel(StoreArgs a)
{
    if (*a.flag & kInputFlags) return;
    const int Hk = a.c.num_kv_heads, D = a.c.head_dim, G = a.c.group;
    const int job = blockIdx.x / Hk, h = blockIdx.x % Hk;
    const bool is_k = blockIdx.y == 0;
    const int* jb = a.jobs + 7 * job;
    const int slot = jb[0], layer = jb[1], page = jb[2], b = jb[3], n_old = jb[4], t0 = jb[5], tile_index = jb[6];
    const int ld = D + 1;  // odd stride: row and column walks are both free of bank conflicts
    const int nv = G > D ? G : D;

    extern __shared__ float smem[];
    float* T = smem;
    float* er = T + G * ld;
    float* ec = er + nv;
    float* lr = ec + nv;
    float* lc = lr + nv;
    float* rb = lc + nv;  // best r
    float* cb = rb + nv;  // best c
    float* rs = cb + nv;
    float* cs = rs + nv;
    float* rlo = cs + nv;
    float* rsc = rlo + nv;
    float* spread = rsc + nv;  // [2]

    // 1. Load: old rows from the fp16 tail, new rows from the input.
    const Strided4& src = is_k ? a.k : a.v;
    const __half* tail = reinterpret_cast<const __half*>(is_k ? a.c.tail_k : a.c.tail_v) +
                         (((int64_t)layer * a.c.num_slots + slot) * Hk + h) * G * D;
    for (int idx = threadIdx.x; idx < G * D; idx += kStoreThreads) {
        const int t = idx / D, d = idx % D;
        float x;
        if (t < n_old) {
            x = __half2float(tail[idx]);
        } else {
            x = load_elem(src.ptr, src.dtype,
                          b * src.stride[0] + (int64_t)(t0 + t - n_old) * src.stride[1] + h * src.stride[2] +
                              d * src.stride[3]);
            if (a.round_f16) x = __half2float(__float2half_rn(x));
        }
        T[t * ld + d] = x;
    }
    __syncthreads();

    // 2. Rotate each token row: block-diagonal Walsh-Hadamard, then the 1/sqrt(block) norm.
    const int blk = hadamard_block(D), half_row = D / 2, half_blk = blk / 2;
    for (int hh = 1; hh < blk; hh <<= 1) {
        for (int p = threadIdx.x; p < G * half_row; p += kStoreThreads) {
            const int t = p / half_row, q = p % half_row;
            const int blk_i = q / half_blk, qq = q % half_blk;
            const int j = blk_i * blk + (qq / hh) * 2 * hh + qq % hh;
            float* row = T + t * ld;
            const float x0 = row[j], x1 = row[j + hh];
            row[j] = x0 + x1;
            row[j + hh] = x0 - x1;
        }
        __syncthreads();
    }
    const float norm = (float)(1.0 / sqrt((double)blk));
    for (int idx = threadIdx.x; idx < G * D; idx += kStoreThreads) T[(idx / D) * ld + idx % D] *= norm;

    // 3. Balance (SPEC §3).
    TileMatrix m{T, ld, is_k ? D : G, is_k ? G : D, is_k};
    for (int i = threadIdx.x; i < nv; i += kStoreThreads) {
        er[i] = ec[i] = rb[i] = cb[i] = 1.0f;
        lr[i] = lc[i] = 0.0f;
    }
    __syncthreads();
    column_std(m, ec, er, cs);
    row_std(m, ec, er, rs);
    __syncthreads();
    const int warp = threadIdx.x >> 5;
    if (warp < 2) {
        const float s = warp == 0 ? warp_spread(cs, m.cols) : warp_spread(rs, m.rows);
        if ((threadIdx.x & 31) == 0) spread[warp] = s;
    }
    __syncthreads();
    float best = spread[0] + spread[1];
    for (int it = 0; it < a.iters; ++it) {
        for (int j = threadIdx.x; j < m.cols; j += kStoreThreads) {
            lc[j] = clampf(lc[j] + logf_cr(clampf(cs[j], 1e-3f, 1e3f)), -0.3f, 10.0f);
            ec[j] = expf_cr(lc[j]);
        }
        __syncthreads();
        row_std(m, ec, er, rs);
        __syncthreads();
        for (int i = threadIdx.x; i < m.rows; i += kStoreThreads) {
            lr[i] = clampf(lr[i] + logf_cr(clampf(rs[i], 1e-3f, 1e3f)), -0.3f, 10.0f);
            er[i] = expf_cr(lr[i]);
        }
        __syncthreads();
        column_std(m, ec, er, cs);
        row_std(m, ec, er, rs);
        __syncthreads();
        if (warp < 2) {
            const float s = warp == 0 ? warp_spread(cs, m.cols) : warp_spread(rs, m.rows);
            if ((threadIdx.x & 31) == 0) spread[warp] = s;
        }
        __syncthreads();
        const float imbalance = spread[0] + spread[1];
        if (imbalance <= best) {  // ties: the later candidate wins (uniform across the block)
            best = imbalance;
            for (int i = threadIdx.x; i < m.rows; i += kStoreThreads) rb[i] = er[i];
            for (int j = threadIdx.x; j < m.cols; j += kStoreThreads) cb[j] = ec[j];
        }
        __syncthreads();
    }

    // 4. RTN per row of the balanced matrix, folded fp16 vectors.
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
        const int lane = threadIdx.x & 31;
        for (int i = warp; i < m.rows; i += kStoreWarps) {
            float lo = INFINITY, hi = -INFINITY;
            for (int j = lane; j < m.cols; j += 32) {
                const float bval = m.x(i, j) / cb[j] / rb[i];
                lo = fminf(lo, bval);
                hi = fmaxf(hi, bval);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
                hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
            }
            const float scale = fmaxf((hi - lo) / qmax, 1e-10f);
            if (lane == 0) {
                rlo[i] = lo;
                rsc[i] = scale;
                fa[i] = to_half_bits(rb[i] * scale, finite);
                fz[i] = to_half_bits(rb[i] * lo, finite);
            }
        }
        for (int j = threadIdx.x; j < m.cols; j += kStoreThreads) fc[j] = to_half_bits(cb[j], finite);
    }
    __syncthreads();
    const int per_byte = 8 / bits;
    const int row_bytes = m.cols / per_byte;
    for (int idx = threadIdx.x; idx < m.rows * row_bytes; idx += kStoreThreads) {
        const int i = idx / row_bytes, jb0 = (idx % row_bytes) * per_byte;
        const float lo = rlo[i], scale = rsc[i], r = rb[i];
        unsigned byte = 0;
        for (int e = 0; e < per_byte; ++e) {
            const int j = jb0 + e;
            const float bval = m.x(i, j) / cb[j] / r;
            const float c = clampf(rintf((bval - lo) / scale), 0.0f, qmax);
            byte |= (unsigned)c << (e * bits);
        }
        codes[idx] = (uint8_t)byte;
    }
    if (!finite) atomicOr(a.flag, KVARN_FLAG_SCALE_OVERFLOW);
    if (a.c.block_table && is_k && h == 0 && threadIdx.x == 0)
        reinterpret_cast<int*>(a.c.block_table)[(int64_t)slot * a.c.max_tiles + tile_index] = page;
}

size_t store_smem_bytes(int G, int D)
{
    const int nv = G > D ? G : D;
    return sizeof(float) * ((size_t)G * (D + 1) + 10 * (size_t)nv + 2);
}

}  // namespace
}  // namespace kvarn_cuda

using namespace kvarn_cuda;

extern "C" int kvarn_cuda_check(const kvarn_cuda_tensor* x, uintptr_t flag, int32_t bit_nonfinite, int32_t bit_range,
                                uintptr_t stream)
{
    if (!x || !flag || x->ndim < 1 || x->ndim > 4) return KVARN_CUDA_ERR_ARGUMENT;
    Strided4 s = as_strided4(*x);
    int64_t n = 1;
    for (int i = 0; i < 4; ++i) n *= s.shape[i];
    if (n == 0) return KVARN_CUDA_OK;
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    const int grid = (int)(blocks < 4096 ? blocks : 4096);
    check_kernel<<<grid, threads, 0, (cudaStream_t)stream>>>(s, n, reinterpret_cast<int*>(flag), bit_nonfinite,
                                                             bit_range);
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
