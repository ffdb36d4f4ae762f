// Scalar kernels: the readable statement of SPEC.md. Built for the baseline
// ISA only (no -m flags), so nothing here can fault on an old CPU.
// Element maths is fp32 in the order SPEC writes it; reductions for means and
// variances accumulate in double. SIMD kernels must reproduce the quantiser's
// codes (exact divisions and round-half-even are used so they can), and the
// attention up to float reassociation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kvarn/kernels.h"
#include "sinkhorn.h"

namespace kvarn {

// ---- fp16 <-> fp32 (bit manipulation; portable, exact) ---------------------
float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                mant <<= 1;
                ++e;
            } while ((mant & 0x400u) == 0);
            mant &= 0x3ffu;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t float_to_half(float f)
{
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {  // inf or NaN
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
        if (absx < 0x33000000u) return (uint16_t)sign;  // < 2^-25 rounds to 0
        uint32_t e = absx >> 23;
        uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - 1 ... gives value in units of 2^-24
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) ++q;
        return (uint16_t)(sign | q);
    }
    uint32_t q = absx - 0x38000000u;  // rebias exponent 127 -> 15
    uint32_t rem = q & 0x1fffu;
    q >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;
    return (uint16_t)(sign | q);
}

namespace {

// ---- Hadamard -----------------------------------------------------------------
template <typename T>
void fwht_block(T* x, int n)
{
    for (int h = 1; h < n; h <<= 1) {
        for (int i = 0; i < n; i += 2 * h) {
            for (int j = i; j < i + h; ++j) {
                T a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
}

template <typename T>
void hadamard_rows(T* x, int64_t rows, int head_dim)
{
    const int block = kvarn_hadamard_block(head_dim);
    const T norm = (T)(1.0 / std::sqrt((double)block));
    for (int64_t r = 0; r < rows; ++r) {
        T* row = x + r * head_dim;
        for (int b = 0; b < head_dim; b += block) fwht_block(row + b, block);
        for (int d = 0; d < head_dim; ++d) row[d] *= norm;
    }
}

void hadamard_f32_scalar(float* x, int64_t rows, int head_dim) { hadamard_rows(x, rows, head_dim); }

// ---- RTN + packing ----------------------------------------------------------------
// Quantises one row of the balanced matrix B (n values) to codes; returns the
// RTN scale and minimum. Packs code i into byte i / (8/bits) at shift (i % (8/bits)) * bits.
void rtn_pack_row(const float* b, int n, int bits, uint8_t* packed, float* scale_out, float* lo_out)
{
    float lo = b[0], hi = b[0];
    for (int i = 1; i < n; ++i) {
        lo = std::min(lo, b[i]);
        hi = std::max(hi, b[i]);
    }
    lo += 0.0f;  // -0 -> +0: which zero a row of mixed zeros keeps depends on the order of comparisons
    const float qmax = (float)((1 << bits) - 1);
    const float scale = std::max((hi - lo) / qmax, KVARN_RTN_SCALE_MIN);
    const int per_byte = 8 / bits;
    std::memset(packed, 0, (size_t)n / per_byte);
    for (int i = 0; i < n; ++i) {
        float c = std::nearbyint((b[i] - lo) / scale);  // default rounding: half to even
        c = c > 0.0f ? std::min(c, qmax) : 0.0f;  // NaN (non-finite input) -> 0: converting NaN is undefined
        packed[i / per_byte] |= (uint8_t)((unsigned)c << ((i % per_byte) * bits));
    }
    *scale_out = scale;
    *lo_out = lo;
}

// Balances, quantises and packs a rows x cols matrix X (row-major): writes the
// packed codes of each row, and the folded vectors a[row] = r*scale,
// z[row] = r*lo, colscale[col] = c. Returns false if any would overflow fp16, or if X holds a NaN or an
// infinity (the C ABI takes tiles unchecked): min/max and the clamps can drop a NaN, leaving a finite,
// valid-looking record (the SIMD kernels fail such a tile the same way, from its column statistics).
bool quantize_matrix(const float* X, int rows, int cols, int bits, int iters, uint8_t* codes,
                     uint16_t* a, uint16_t* z, uint16_t* colscale)
{
    bool finite = true;
    for (size_t e = 0; e < (size_t)rows * cols; ++e) finite = finite && std::isfinite(X[e]);
    std::vector<float> r(rows), c(cols), inv_r(rows), inv_c(cols), balanced((size_t)rows * cols);
    sinkhorn_balance(X, rows, cols, iters, r.data(), c.data());
    // B = X / (r ⊗ c) as two multiplications by reciprocals (divisions cost 3-5x more per element;
    // B moves by <= 2 ulp, which only matters at rounding near-ties).
    for (int i = 0; i < rows; ++i) inv_r[i] = 1.0f / r[i];
    for (int j = 0; j < cols; ++j) inv_c[j] = 1.0f / c[j];
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j)
            balanced[(size_t)i * cols + j] = X[(size_t)i * cols + j] * inv_c[j] * inv_r[i];
    const size_t row_bytes = kvarn_packed_row_bytes(cols, bits);
    for (int i = 0; i < rows; ++i) {
        float scale, lo;
        rtn_pack_row(&balanced[(size_t)i * cols], cols, bits, codes + i * row_bytes, &scale, &lo);
        a[i] = float_to_half(r[i] * scale);
        z[i] = float_to_half(r[i] * lo);
        finite = finite && (a[i] & 0x7c00u) != 0x7c00u && (z[i] & 0x7c00u) != 0x7c00u;
    }
    for (int j = 0; j < cols; ++j) {
        colscale[j] = float_to_half(c[j]);
        finite = finite && (colscale[j] & 0x7c00u) != 0x7c00u;
    }
    return finite;
}

void to_float_scalar(const void* src, int input_type, float* dst, int64_t n);

int quantize_tile_scalar(const void* k, const void* v, int input_type, const TileFormat& fmt, int iters, uint8_t* record,
                         int parts)
{
    const int G = fmt.group, D = fmt.head_dim;
    const kvarn_record_layout L = record_layout(fmt);
    std::vector<float> rotated((size_t)G * D), xk((size_t)D * G);
    bool ok = true;

    if (parts & kQuantizeK) {
        // K: rotate each token's channels, then lay out rows = channels.
        to_float_scalar(k, input_type, rotated.data(), (int64_t)G * D);
        hadamard_rows(rotated.data(), G, D);
        for (int t = 0; t < G; ++t)
            for (int d = 0; d < D; ++d) xk[(size_t)d * G + t] = rotated[(size_t)t * D + d];
        ok = quantize_matrix(xk.data(), D, G, fmt.kbits, iters, record + L.k_codes,
                             reinterpret_cast<uint16_t*>(record + L.ka), reinterpret_cast<uint16_t*>(record + L.kz),
                             reinterpret_cast<uint16_t*>(record + L.kt));
    }
    if (parts & kQuantizeV) {
        // V: rows = tokens, already the layout of v.
        to_float_scalar(v, input_type, rotated.data(), (int64_t)G * D);
        hadamard_rows(rotated.data(), G, D);
        ok = quantize_matrix(rotated.data(), G, D, fmt.vbits, iters, record + L.v_codes,
                             reinterpret_cast<uint16_t*>(record + L.va), reinterpret_cast<uint16_t*>(record + L.vz),
                             reinterpret_cast<uint16_t*>(record + L.vc)) && ok;
    }
    return ok ? 0 : 1;
}

// ---- attention ----------------------------------------------------------------
inline unsigned code_at(const uint8_t* packed_row, int i, int bits)
{
    const int per_byte = 8 / bits;
    return (packed_row[i / per_byte] >> ((i % per_byte) * bits)) & ((1u << bits) - 1u);
}

// Online-softmax step for one query head: folds scores s[0..n) into (m, l),
// rescaling both accumulators, and leaves p = exp(s - m_new) in s.
inline void softmax_update(float* s, int64_t n, float* m, float* l, float* acc_orig, float* acc_rot, int D)
{
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) block_max = std::max(block_max, s[t]);
    const float m_new = std::max(*m, block_max);
    const float alpha = std::exp(*m - m_new);  // exp(-inf) = 0 on the first block
    if (alpha != 1.0f) {
        *l *= alpha;
        for (int d = 0; d < D; ++d) {
            acc_orig[d] *= alpha;
            acc_rot[d] *= alpha;
        }
    }
    float sum = 0.0f;
    for (int64_t t = 0; t < n; ++t) {
        s[t] = std::exp(s[t] - m_new);
        sum += s[t];
    }
    *l += sum;
    *m = m_new;
}

void attend_tiles_scalar(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record,
                         int64_t n_tiles, int64_t tile_stride, SoftmaxState st)
{
    const int G = fmt.group, D = fmt.head_dim;
    const kvarn_record_layout L = record_layout(fmt);
    const size_t k_row_bytes = kvarn_packed_row_bytes(G, fmt.kbits);
    const size_t v_row_bytes = kvarn_packed_row_bytes(D, fmt.vbits);
    std::vector<float> qa(D), s(G), tmp(D);
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const uint8_t* rec = first_record + tile * tile_stride;
        const uint16_t* ka = reinterpret_cast<const uint16_t*>(rec + L.ka);
        const uint16_t* kz = reinterpret_cast<const uint16_t*>(rec + L.kz);
        const uint16_t* kt = reinterpret_cast<const uint16_t*>(rec + L.kt);
        const uint16_t* vc = reinterpret_cast<const uint16_t*>(rec + L.vc);
        const uint16_t* va = reinterpret_cast<const uint16_t*>(rec + L.va);
        const uint16_t* vz = reinterpret_cast<const uint16_t*>(rec + L.vz);
        for (int h = 0; h < n_q; ++h) {
            const float* q = q_rot + (size_t)h * D;
            // score_t = kt[t] * (sum_d (q_d ka_d) code[d,t] + sum_d q_d kz_d)
            float qz = 0.0f;
            for (int d = 0; d < D; ++d) {
                qa[d] = q[d] * half_to_float(ka[d]);
                qz += q[d] * half_to_float(kz[d]);
            }
            std::fill(s.begin(), s.end(), 0.0f);
            for (int d = 0; d < D; ++d) {
                const uint8_t* row = rec + L.k_codes + d * k_row_bytes;
                for (int t = 0; t < G; ++t) s[t] += qa[d] * (float)code_at(row, t, fmt.kbits);
            }
            for (int t = 0; t < G; ++t) s[t] = half_to_float(kt[t]) * (s[t] + qz);

            float* acc_rot = st.acc_rot + (size_t)h * D;
            softmax_update(s.data(), G, &st.m[h], &st.l[h], st.acc_orig + (size_t)h * D, acc_rot, D);

            // out_d += vc[d] * (sum_t (p_t va_t) code[t,d] + sum_t p_t vz_t)
            float pz = 0.0f;
            std::fill(tmp.begin(), tmp.end(), 0.0f);
            for (int t = 0; t < G; ++t) {
                const float w = s[t] * half_to_float(va[t]);
                pz += s[t] * half_to_float(vz[t]);
                const uint8_t* row = rec + L.v_codes + t * v_row_bytes;
                for (int d = 0; d < D; ++d) tmp[d] += w * (float)code_at(row, d, fmt.vbits);
            }
            for (int d = 0; d < D; ++d) acc_rot[d] += half_to_float(vc[d]) * (tmp[d] + pz);
        }
    }
}

void attend_dense_f16_scalar(const float* q_all, int n_q, int D, const uint16_t* k, const uint16_t* v,
                             int64_t n, int64_t row_stride, SoftmaxState st)
{
    constexpr int64_t kBlock = 64;
    std::vector<float> s(kBlock);
    for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
        const int64_t nb = std::min(kBlock, n - t0);
        for (int h = 0; h < n_q; ++h) {
            const float* q = q_all + (size_t)h * D;
            for (int64_t t = 0; t < nb; ++t) {
                const uint16_t* krow = k + (t0 + t) * row_stride;
                float dot = 0.0f;
                for (int d = 0; d < D; ++d) dot += q[d] * half_to_float(krow[d]);
                s[t] = dot;
            }
            float* acc = st.acc_orig + (size_t)h * D;
            softmax_update(s.data(), nb, &st.m[h], &st.l[h], acc, st.acc_rot + (size_t)h * D, D);
            for (int64_t t = 0; t < nb; ++t) {
                const uint16_t* vrow = v + (t0 + t) * row_stride;
                for (int d = 0; d < D; ++d) acc[d] += s[t] * half_to_float(vrow[d]);
            }
        }
    }
}

void to_float_scalar(const void* src, int input_type, float* dst, int64_t n)
{
    if (input_type == KVARN_INPUT_F16) {
        const uint16_t* h = static_cast<const uint16_t*>(src);
        for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(h[i]);
    } else if (input_type == KVARN_INPUT_F32_AS_F16) {
        const float* f = static_cast<const float*>(src);
        for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(float_to_half(f[i]));
    } else {
        std::memcpy(dst, src, sizeof(float) * (size_t)n);
    }
}

const KernelTable kScalar = {
    "scalar", hadamard_f32_scalar, quantize_tile_scalar, attend_tiles_scalar, attend_dense_f16_scalar,
    to_float_scalar,
};

}  // namespace

void hadamard_f64_rows(double* x, int64_t rows, int head_dim) { hadamard_rows(x, rows, head_dim); }

const KernelTable* scalar_kernels() { return &kScalar; }

}  // namespace kvarn
