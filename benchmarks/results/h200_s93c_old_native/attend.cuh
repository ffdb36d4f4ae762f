// Fused decode attention over a paged pool of tile records (+ fp16 sink/tail).
//
// Work: one program (CTA) per (sequence, kv head, <=8 query heads of its GQA
// group, split of the tiles). Its warps take whole tiles in turn (VAR 12: warp
// pairs take a tile together, a token half each; tiles_pair); each warp
// streams its records into its own shared-memory stages with the bulk-copy
// engine (one contiguous record = one cp.async.bulk, completing on an
// mbarrier), so loads of the next records overlap the current tile's maths.
// Every program also takes an equal share of the full-precision sink + tail
// tokens (original frame) after its tiles, so no program is left with only
// that (serial, latency-bound) work and the grid is splits x heads x B: one
// wave where the split count was chosen for one. The programs' two states each
// (online-softmax m, l, acc; log2 domain) are merged -- the tile part rotated back
// with the Hadamard, the full-precision part added -- either inside the launch
// (direct path: the splits of a head group form a thread-block cluster and merge
// through distributed shared memory, cluster_merge) or by merge_kernel (api.cu).
//
// Per tile, with codes never leaving registers (SPEC §7 algebra):
//   score_t = kt[t] * (sum_d (q_d ka_d) code[d,t] + sum_d q_d kz_d)
//   out_d  += vc[d] * (sum_t (p_t va_t) code[t,d] + sum_t p_t vz_t)
// Both sums run on fp16 tensor cores (mma.m16n8k16, fp32 accumulate). Codes are
// exact in fp16; the other operand (q*ka, or p*va) is split into hi + lo fp16 parts placed in
// rows g and g+8 of the 16-row A fragment -- rows a GQA group of <= 8 heads leaves free -- with
// a per-tile power-of-two scale that keeps them inside fp16's range. Codes are unpacked with
// byte_perm + one LOP3 into the fp16 exponent trick (0x6400 | code << shift = 1024 + code *
// 2^shift) and kept so (offset codes, KVARN_OFFSET_CODES below): the accumulators start at
// -1024 * (row sum of A), and hi sits on a 2^6 grid so the inflated sums stay exact. The 2^shift
// is folded into the per-column epilogue.
//
// Fragment maps (g = lane / 4, c = lane % 4; NJ = G/8, NI = D/8):
//   QK, k-step s: k = 2c+e+8f <-> channel 16s + 4(e+2f) + c; n-chunk j, col n <-> token NJ*n + j
//     (so thread g reads NJ consecutive tokens of a K row: one 32/64-bit load).
//   PV, k-step u: k = 2c+e+8f <-> token NJ(2c+e) + 2u + f, which is where the QK
//     accumulator left p (C fragment of two n-chunks = A fragment, as in FA2);
//     n-chunk i, col n <-> channel NI*n + i (thread g reads NI consecutive codes of a V row).
#pragma once

#include <cooperative_groups.h>
#include <math_constants.h>

#include <map>
#include <mutex>
#include <tuple>

#include "common.cuh"

namespace kvarn_cuda {

struct AttendArgs {
    kvarn_cuda_cache c;
    RecordLayout L;
    int layer;
    const int* meta;  // [B][4]: slot, num_tiles, sink_len, tail_len
    Strided4 q;       // [B, T, Hq, D]: meta row b is token b % T of sequence b / T (row_offset)
    int q_tokens;     // T
    int num_q_heads;
    float scale;      // softmax scale; q_scaled applies it, then log2(e): scores in the log2 domain
    float* states;    // [B][Hq][2 * splits][D + 2]: m, l, acc[D] (tiles, then sink/tail, per split)
    int splits, tiles_per_split, q_chunks, stages_per_warp;
    // direct = 1: the programs of one (sequence, kv head, query chunk) form a thread-block cluster
    // of `splits` CTAs (<= 8) and merge their states through distributed shared memory, writing
    // `out` themselves: no states in global memory, no merge kernel.
    int direct;
    Strided4 out;     // [B, T, Hq, D], as q (direct only)
};

template <int KB, int VB, int G, int D, int NIPC = 16>
struct AttendCfg {
    static constexpr int NJ = G / 8;                 // score n-chunks
    static constexpr int NI = D / 8;                 // output n-chunks
    static constexpr int KS = D / 16;                // QK k-steps
    static constexpr int US = G / 16;                // PV k-steps
    static constexpr int NIP = NI < NIPC ? NI : NIPC;  // output chunks per PV pass (register budget)
    static constexpr int NPASS = NI / NIP;
    static constexpr int KROW = G * KB / 8;          // bytes of one K code row
    static constexpr int VROW = D * VB / 8;          // bytes of one V code row
    static constexpr int KBITS_T = NJ * KB;          // bits of a K row one thread reads
    static constexpr int VBITS_T = NIP * VB;         // bits of a V row one thread reads per pass
    static constexpr int QLD = D + 4;                // padded q row: conflict-free fragment reads
};

template <int BITS>
struct Words {
    static constexpr int N = BITS >= 32 ? BITS / 32 : 1;
    uint32_t w[N];
    __device__ __forceinline__ void load(const uint8_t* p)
    {
        if constexpr (BITS == 16) {
            w[0] = *reinterpret_cast<const uint16_t*>(p);
        } else if constexpr (BITS == 32) {
            w[0] = *reinterpret_cast<const uint32_t*>(p);
        } else if constexpr (BITS == 64) {
            const uint2 x = *reinterpret_cast<const uint2*>(p);
            w[0] = x.x;
            w[1] = x.y;
        } else {
            static_assert(BITS == 128, "code words are 16, 32, 64 or 128 bits");
            const uint4 x = *reinterpret_cast<const uint4*>(p);
            w[0] = x.x;
            w[1] = x.y;
            w[2] = x.z;
            w[3] = x.w;
        }
    }
};

// Codes through the 1024 magic number (0, default: LOP3 + HSUB2 per half2) or as fp16 subnormals
// (1: one LOP3 per half2, ~15 % faster at 32K x 8 on an H200). The subnormal path is exact in
// principle but fails the 2e-4 tolerance on the H200 (relative errors 2.3e-4 at 643 tokens,
// 3.9e-4 at 9,000 tokens, fp16-level, where the magic path passes; also with lo kept at hi's
// magnitude): the tensor cores evidently lose precision on subnormal operands. Kept for study.
#ifndef KVARN_SUBNORMAL_CODES
#define KVARN_SUBNORMAL_CODES 0
#endif
// Offset codes (default 1): the magic-number codes keep their 1024 (one LOP3 per half2, no
// HSUB2), B = 1024 + code * 2^shift, and the MMA accumulators start at -1024 * sum_k A[row, k]
// (one more MMA per k-step, B = -1024). The hi part is x rounded to a multiple of 2^kHiGrid
// (|x| < 2^15: 9 bits), so the hi row's products and sums lie on that grid and stay exact in the
// fp32 accumulator while partial sums are below 2^30 (beyond, they round at 2^-24 of a partial
// sum, ~2^-17 of the score scale); lo = x - hi (|lo| <= 2^5, fp16) carries 11 more bits.
// kHiGrid trades the two errors: 2^10 (hi exact always, 16 bits in all) measured 1.3-2.3e-4 on
// the H200 (fails 2e-4); an fp64 emulation put 2^6 at ~1-3e-5 and 2^4 at 1.3e-4 (rounding).
// 0: the previous way, (0x6400 | bits) - 1024 with an HSUB2 per half2 and hi/lo = fp16(x), 2^11 * rest.
// The switch reaches the row-split tile loop only: the served k4v2 loops at G = D = 128 (tiles_swapped, tiles_pair)
// hard-code the offset codes (their P.V product: KVARN_SWAPPED_PV_OFFSET).
#ifndef KVARN_OFFSET_CODES
#define KVARN_OFFSET_CODES 1
#endif
constexpr bool kOffsetCodes = KVARN_OFFSET_CODES && !KVARN_SUBNORMAL_CODES;
// The swapped-operand k4v2 loops' P.V product (A = the 2-bit value codes). 1 (default): offset codes, whose
// 1024-inflated sums round at a fixed fraction of each product. With the products scaled by the running maximum's
// weight (p <= 1), a long context's late tiles, whose weights sit far below that maximum, had products of a few
// units, and the rounding added up over a program's tiles: 4.0e-4 relative at 128K x 32 with near-flat attention
// (s63). Scaled by each tile's own largest weight (swapped_softmax), 1.6e-5 / 3.7e-7 of the values summed (s64c).
// 0: HSUB2 codes (code * 2^shift exactly, accumulators from 0; split_grid's hi on the 2^6 grid keeps the hi row's
// sums exact): 1.1e-5 / 2.6e-7 there with the old scale, but 4.3 % slower at 32K x 8 and 6.4-7.3 % at 128K x 32 / 8
// (s63g, docs/cuda.md); -DKVARN_SWAPPED_PV_OFFSET=0 (CMAKE_CUDA_FLAGS) builds it. With KVARN_SUBNORMAL_CODES (a
// study build) the swapped loops' P.V accumulators start at 0, as that code form needs.
#ifndef KVARN_SWAPPED_PV_OFFSET
#define KVARN_SWAPPED_PV_OFFSET 1
#endif
constexpr bool kSwappedPvOffset = KVARN_SWAPPED_PV_OFFSET && !KVARN_SUBNORMAL_CODES;
// Offset codes for a head_dim: not at D 256, where the QK sums run over 256 channels and their
// partial sums pass 2^30 (the hi row then rounds: relative errors up to 3.7e-4 measured on the
// H200, k2v2_g128, GQA 8); D 256 keeps the HSUB2 arithmetic (~3e-6).
#ifndef KVARN_OFFSET_CODES_D256
#define KVARN_OFFSET_CODES_D256 0  // 1: offset codes at D 256 too (the arithmetic before this switch)
#endif
// Also only for k4v2 (the default family): a seed sweep on the H200 found k2v2_g128 at D 128
// over the 2e-4 tolerance (5.4e-4, 1 case in 20 seeds x 45) and k4v4_g64 at 1.5e-4, while k4v2
// stayed <= 2.7e-5; the other presets take the HSUB2 arithmetic (~3e-6) and its few more instructions.
template <int KB, int VB, int D>
__host__ __device__ constexpr bool offset_codes_for()
{
    return kOffsetCodes && KB == 4 && VB == 2 && (D <= 128 || KVARN_OFFSET_CODES_D256);
}

// From two rows' words (same code positions), out[m] = half2(row0 code m, row1 code m) * 2^shift(m) * u,
// shift(m) = (m % (8/BITS)) * BITS. Subnormal codes: the masked bits read as fp16 with exponent
// field 0, value = mantissa * 2^-24 (u = 2^-24), so one LOP3 per half2 and no subtraction; the
// tensor cores take fp16 subnormal inputs. Magic: (0x6400 | bits) - 1024 (u = 1). The factor
// 1 / (2^shift u) is applied per output column in the epilogues (code_unshift).
template <int BITS, int NBITS, bool OFF = kOffsetCodes>
__device__ __forceinline__ void unpack_pairs(const uint32_t* w0, const uint32_t* w1, uint32_t* out,
                                             uint32_t sel_even = 0x5410, uint32_t sel_odd = 0x7632)
{
    constexpr int PER = 8 / BITS;
    constexpr int NBYTES = NBITS / 8;
#if !KVARN_SUBNORMAL_CODES
    constexpr uint32_t kMagic = 0x64006400u;  // fp16 1024 in both halves
    const __half2 k1024 = __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400));
#endif
#pragma unroll
    for (int bp = 0; bp < NBYTES / 2; ++bp) {
        const int wi = bp / 2;
        // low half: row0's bytes (2p, 2p+1); high half: row1's.
        // (a per-thread selector pair 0x1054 / 0x3276 takes the rows the other way round)
        const uint32_t y = __byte_perm(w0[wi], w1[wi], (bp % 2) == 0 ? sel_even : sel_odd);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const uint32_t z = b ? (y >> 8) : y;
#pragma unroll
            for (int f = 0; f < PER; ++f) {
                constexpr uint32_t one = (1u << BITS) - 1u;
                const uint32_t mask = (one << (f * BITS)) | (one << (16 + f * BITS));
#if KVARN_SUBNORMAL_CODES
                out[(bp * 2 + b) * PER + f] = z & mask;
#else
                uint32_t v;  // (z & mask) | magic in one LOP3 (ptxas left it as two)
                asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(z), "r"(mask), "r"(kMagic));
                if constexpr (OFF) {
                    out[(bp * 2 + b) * PER + f] = v;  // 1024 + code * 2^shift: the accumulators start at -1024 sum A
                } else {
                    __half2 h = __hsub2(*reinterpret_cast<__half2*>(&v), k1024);
                    out[(bp * 2 + b) * PER + f] = *reinterpret_cast<uint32_t*>(&h);
                }
#endif
            }
        }
    }
}

// 1 / (2^shift(m) u): turns column m of a product with unpacked codes back into code units.
template <int BITS>
__device__ __forceinline__ constexpr float code_unshift(int m)
{
#if KVARN_SUBNORMAL_CODES
    return (float)(1 << 24) / (float)(1 << ((m % (8 / BITS)) * BITS));
#else
    return 1.0f / (float)(1 << ((m % (8 / BITS)) * BITS));
#endif
}

// x (fp32, |x| < 2^15) as hi + lo * 2^-11 with hi, lo fp16: ~22 bits of x. lo is kept 2^11 up,
// at hi's magnitude, so its products with (subnormal) codes stay as large as hi's.
constexpr float kLoScale = 2048.0f, kLoUnscale = 1.0f / 2048.0f;
__device__ __forceinline__ void split_hi_lo(float x, __half& hi, __half& lo)
{
    hi = __float2half_rn(x);
    lo = __float2half_rn((x - __half2float(hi)) * kLoScale);
}

// Offset codes: x = a * b (|x| <= 2^15) as hi = x rounded to a multiple of 2^kHiGrid (RN, by
// the 1.5 * 2^(23 + kHiGrid) magic add, fused with the product) and lo = x - hi (one FFMA:
// the exact product minus hi, rounded once; |lo| <= 2^(kHiGrid - 1), then fp16: 11 more bits).
// The accumulators of rows g (hi) and g + 8 (lo) start at -1024 * (sum of that row's parts).
constexpr int kHiGrid = 6;
__device__ __forceinline__ void split_grid(float a, float b, float& hi, float& lo)
{
    constexpr float kRound = 1.5f * (float)(1ull << (23 + kHiGrid));
    hi = __fsub_rn(__fmaf_rn(a, b, kRound), kRound);
    lo = __fmaf_rn(a, b, -hi);
}

// Packs (hi, lo) parts of the 4 values a[q] * b[q] into the A fragment words of rows g (hi)
// and g + 8 (lo) (offset codes: split_grid; otherwise the old split of the rounded product).
template <bool OFF = kOffsetCodes>
__device__ __forceinline__ void split_pack4(const float (&a)[4], const float (&b)[4], uint32_t (&A)[4])
{
    if constexpr (OFF) {
        float hi[4], lo[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) split_grid(a[q], b[q], hi[q], lo[q]);
        A[0] = pack_half2(__float2half_rn(hi[0]), __float2half_rn(hi[1]));
        A[1] = pack_half2(__float2half_rn(lo[0]), __float2half_rn(lo[1]));
        A[2] = pack_half2(__float2half_rn(hi[2]), __float2half_rn(hi[3]));
        A[3] = pack_half2(__float2half_rn(lo[2]), __float2half_rn(lo[3]));
    } else {
        __half hi[4], lo[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) split_hi_lo(a[q] * b[q], hi[q], lo[q]);
        A[0] = pack_half2(hi[0], hi[1]);
        A[1] = pack_half2(lo[0], lo[1]);
        A[2] = pack_half2(hi[2], hi[3]);
        A[3] = pack_half2(lo[2], lo[3]);
    }
}

// Offset codes: the accumulators' start values -1024 * sum_k A[row, k], computed on the tensor
// cores (one more MMA per k-step with B = -1024 everywhere; see above for its precision):
// start[0..1] for row g (hi), start[2..3] for row g + 8 (lo) -- the C fragment layout.
// CH > 1: CH independent MMA chains (STEPS / CH deep instead of STEPS) added at the end; the hi
// row's partial sums are multiples of 2^(kHiGrid + 10) below 2^32, so they add exactly.
template <int STEPS, bool OFF = kOffsetCodes, int CH = 1>
__device__ __forceinline__ void offset_start(const uint32_t (&A)[STEPS][4], float (&start)[4])
{
    constexpr uint32_t kNeg1024 = 0xE400E400u;  // fp16 -1024 in both halves
    start[0] = start[1] = start[2] = start[3] = 0.0f;
    if constexpr (OFF) {
        constexpr int NC = CH < STEPS ? CH : STEPS;
        static_assert(STEPS % NC == 0, "chains divide the steps");
        float part[NC][4];
#pragma unroll
        for (int h = 0; h < NC; ++h) part[h][0] = part[h][1] = part[h][2] = part[h][3] = 0.0f;
#pragma unroll
        for (int s = 0; s < STEPS; ++s)
            mma_16816(part[s % NC], A[s][0], A[s][1], A[s][2], A[s][3], kNeg1024, kNeg1024);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float x = part[0][q];
            if constexpr (NC == 4) x = (part[0][q] + part[1][q]) + (part[2][q] + part[3][q]);
            else {
#pragma unroll
                for (int h = 1; h < NC; ++h) x += part[h][q];
            }
            start[q] = x;
        }
    }
}

// lo's weight in the combined row: 1 for offset codes (lo unscaled), 2^-11 otherwise.
template <bool OFF>
__host__ __device__ constexpr float lo_weight() { return OFF ? 1.0f : kLoUnscale; }

template <int N>
__device__ __forceinline__ void load_halves(const __half* p, float (&out)[N])
{
    static_assert(N % 8 == 0, "vector loads of 8 halves");
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
        const uint4 x = reinterpret_cast<const uint4*>(p)[i];
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const __half2 h = *reinterpret_cast<const __half2*>(&w[k]);
            const float2 f = __half22float2(h);
            out[8 * i + 2 * k] = f.x;
            out[8 * i + 2 * k + 1] = f.y;
        }
    }
}

// Power-of-two scale bringing amax into [2^14, 2^15): 2^sh and 2^-sh.
__device__ __forceinline__ void pow2_scale(float amax, float& s, float& inv)
{
    int e = (int)((__float_as_uint(amax) >> 23) & 0xffu) - 127;
    int sh = 14 - e;
    sh = sh < -103 ? -103 : (sh > 126 ? 126 : sh);  // 2^-sh * 2^24 (code_unshift) stays finite
    s = exp2i(sh);
    inv = exp2i(-sh);
}

// The shift of pow2_scale, capped at max_sh.
__device__ __forceinline__ int pow2_shift(float amax, int max_sh)
{
    const int e = (int)((__float_as_uint(amax) >> 23) & 0xffu) - 127;
    const int sh = 14 - e;
    return sh < -103 ? -103 : (sh > max_sh ? max_sh : sh);
}

// 2^x for x <= 0 (softmax weights): the bare MUFU.EX2 (~2 ulp, subnormal results flushed to 0),
// without exp2f's range fix-up around it.
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}

// Loads of n halves (2, 4 or 8) at once.
template <int N>
struct HalfVec;
template <>
struct HalfVec<2> {
    using T = uint32_t;
};
template <>
struct HalfVec<4> {
    using T = uint2;
};
template <>
struct HalfVec<8> {
    using T = uint4;
};

template <int N>
__device__ __forceinline__ void halves_to_float(const typename HalfVec<N>::T& v, float (&out)[N])
{
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
        out[2 * k] = f.x;
        out[2 * k + 1] = f.y;
    }
}

// Full-precision sink + tail (original frame): lane's D / 32 channels of K and V for the tokens
// t0 + u * nw (u < U) below d_end -- token t < sink_len from the sink, else tail row t - sink_len --
// of head `dhead` (= (layer * num_slots + slot) * Hk + kv head). Rows at or past d_end are left as
// they are.
template <int G, int D, int U>
__device__ __forceinline__ void load_dense_round(const AttendArgs& a, int64_t dhead, int sink_len, int t0, int nw,
                                                 int d_end, int lane, typename HalfVec<D / 32>::T (&kraw)[U],
                                                 typename HalfVec<D / 32>::T (&vraw)[U])
{
    constexpr int DPL = D / 32;
    using Vec = typename HalfVec<DPL>::T;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int t = t0 + u * nw;
        if (t < d_end) {
            const __half *kr, *vr;
            if (t < sink_len) {
                const int64_t off = (dhead * a.c.sink_cap + t) * D;
                kr = reinterpret_cast<const __half*>(a.c.sink_k) + off;
                vr = reinterpret_cast<const __half*>(a.c.sink_v) + off;
            } else {
                const int64_t off = (dhead * G + (t - sink_len)) * D;
                kr = reinterpret_cast<const __half*>(a.c.tail_k) + off;
                vr = reinterpret_cast<const __half*>(a.c.tail_v) + off;
            }
            kraw[u] = *reinterpret_cast<const Vec*>(kr + lane * DPL);
            vraw[u] = *reinterpret_cast<const Vec*>(vr + lane * DPL);
        }
    }
}

// One step of the sink/tail online softmax for one (token, head): score sc (log2 domain), the lane's
// V channels vv into the running m, l and acc.
template <int DPL>
__device__ __forceinline__ void dense_update(float& m, float& l, float (&acc)[DPL], float sc, const float (&vv)[DPL])
{
    const float m_new = fmaxf(m, sc);
    const float alpha = exp2f(m - m_new);
    const float pw = exp2f(sc - m_new);
    l = fmaf(l, alpha, pw);
#pragma unroll
    for (int k = 0; k < DPL; ++k) acc[k] = fmaf(acc[k], alpha, pw * vv[k]);
    m = m_new;
}

// q * scale * log2(e) in two steps: scale * log2(e) alone overflows float32 for |scale| > 2.36e38,
// which the query check allows with a small enough q.
__device__ __forceinline__ float q_scaled(float x, float scale) { return (x * scale) * 1.4426950408889634f; }

template <int D>
__device__ __forceinline__ void load_q(const AttendArgs& a, float* qs, int qld, int b, int h0, int nq)
{
    const int64_t q_row = row_offset(a.q, b, a.q_tokens);
    for (int idx = threadIdx.x; idx < 8 * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        float x = 0.0f;
        if (h < nq)
            x = q_scaled(load_elem(a.q.ptr, a.q.dtype, q_row + (int64_t)(h0 + h) * a.q.stride[2] +
                                                       d * a.q.stride[3]),
                         a.scale);
        qs[h * qld + d] = x;
    }
}

// Instances with the direct path (cluster merge, attend_kernel's a.direct) compiled in: not D 256
// (there its code raised the tile loop's spills, ptxas: 4 -> 236 bytes).
template <int D, int VAR>
__host__ __device__ constexpr bool direct_for() { return D <= 128; }

// Every warp has written ws_m/ws_l/ws_acc (rows of warps that saw nothing: m = -inf); element r
// (0: m, 1: l, 2 + d: acc[d]) of head h's state combined over the warps.
template <int D>
__device__ __forceinline__ float combine_warps(const float* ws_m, const float* ws_l, const float* ws_acc, int nw, int h,
                                               int r)
{
    float M = -CUDART_INF_F;
    for (int w = 0; w < nw; ++w) M = fmaxf(M, ws_m[w * 8 + h]);
    if (M == -CUDART_INF_F) return r == 0 ? -CUDART_INF_F : 0.0f;
    if (r == 0) return M;
    float val = 0.0f;
    for (int w = 0; w < nw; ++w) {
        const float wt = exp2f(ws_m[w * 8 + h] - M);  // 0 for warps that saw nothing
        val = fmaf(wt, r == 1 ? ws_l[w * 8 + h] : ws_acc[(w * 8 + h) * D + r - 2], val);
    }
    return val;
}

// The program's states of parts [part0, part0 + nparts) (0: tiles, Hadamard frame; 1: sink/tail,
// original frame), combined over the warps from consecutive ws areas (ws_floats apart; part 0
// empty when !tiles_valid), into global state slot `split` / `splits + split`, or, on the direct
// path, into this CTA's cs [2][8][D + 2] for the cluster merge.
template <int D>
__device__ __forceinline__ void finish_states(const AttendArgs& a, const float* ws, int ws_floats, int part0, int nparts,
                                              bool tiles_valid, int nw, int b, int h0, int nq, int split, float* cs)
{
    const int per = nq * (D + 2);
    for (int idx = threadIdx.x; idx < nparts * per; idx += blockDim.x) {
        const int pi = idx / per, rem = idx % per, h = rem / (D + 2), r = rem % (D + 2);
        const int part = part0 + pi;
        const float* ws_m = ws + (size_t)pi * ws_floats;
        float val;
        if (part == 0 && !tiles_valid)
            val = r == 0 ? -CUDART_INF_F : 0.0f;  // nothing read: an empty state (merges skip l == 0)
        else
            val = combine_warps<D>(ws_m, ws_m + nw * 8, ws_m + nw * 16, nw, h, r);
        if (a.direct) {
            cs[(part * 8 + h) * (D + 2) + r] = val;
        } else {
            const int nslots = 2 * a.splits;
            const int slot_idx = part == 0 ? split : a.splits + split;
            a.states[(((size_t)b * a.num_q_heads + h0 + h) * nslots + slot_idx) * (D + 2) + r] = val;
        }
    }
}

// The owner's combine of output (head hl, channel d) from the S splits' states (mt, lt, at: the
// tile part, Hadamard frame; md, ld, ad: sink/tail, original frame; states with l == 0 skipped): L
// and both parts' sums, then the tile part's butterflies below 32 by warp shuffles into rot (the
// rest: merge_store, after a barrier), the sink/tail part into dense, L into Ls. cluster_merge and
// push_merge differ only in where they read the states from (same operations, same order: same bits).
template <int D>
__device__ __forceinline__ void merge_splits(const float (&mt)[8], const float (&lt)[8], const float (&at)[8],
                                             const float (&md)[8], const float (&ld)[8], const float (&ad)[8], int S,
                                             int hl, int d, float* buf)
{
    float* rot = buf;            // [hp][D]: tile part after the in-warp stages
    float* dense = buf + 8 * D;  // [hp][D]
    float* Ls = buf + 16 * D;    // [hp]
    float M = -CUDART_INF_F;
#pragma unroll
    for (int r = 0; r < 8; ++r)
        if (r < S) {
            if (lt[r] > 0.0f) M = fmaxf(M, mt[r]);
            if (ld[r] > 0.0f) M = fmaxf(M, md[r]);
        }
    float L = 0.0f, tile_part = 0.0f, dense_part = 0.0f;
#pragma unroll
    for (int r = 0; r < 8; ++r)
        if (r < S) {
            if (lt[r] != 0.0f) {
                const float w = exp2f(mt[r] - M);
                L = fmaf(w, lt[r], L);
                tile_part += w * at[r];
            }
            if (ld[r] != 0.0f) {
                const float w = exp2f(md[r] - M);
                L = fmaf(w, ld[r], L);
                dense_part += w * ad[r];
            }
        }
    float x = tile_part;
#pragma unroll
    for (int hh = 1; hh < 32; hh <<= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, x, hh);
        x = (d & hh) ? o - x : x + o;
    }
    rot[hl * D + d] = x;
    dense[hl * D + d] = dense_part;
    if (d == 0) Ls[hl] = L;
}

// After merge_splits and a barrier: for each of the n_items outputs (head h_lo + idx / D, channel
// idx % D) the tile part's remaining Hadamard stages from rot, scaled, plus the sink/tail part from
// dense, divided by L, stored to out.
template <int D>
__device__ __forceinline__ void merge_store(const AttendArgs& a, const float* buf, int n_items, int h_lo, int b, int h0)
{
    const float* rot = buf;
    const float* dense = buf + 8 * D;
    const float* Ls = buf + 16 * D;
    constexpr int NB = D / 32;  // butterfly inputs per output in the cross-warp stages
    const float norm = rsqrtf((float)D);
    const int64_t out_row = row_offset(a.out, b, a.q_tokens);
    for (int idx = threadIdx.x; idx < n_items; idx += blockDim.x) {
        const int hl = idx / D, d = idx % D, h = h_lo + hl;
        // the remaining stages for output d: sum_j (-1)^popc(j & (d / 32)) x[d % 32 + 32 j]
        // (a selected butterfly output would index a register array at run time: local memory)
        float y = 0.0f;
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            const float v = rot[hl * D + (d & 31) + 32 * j];
            y += (__popc(j & (d >> 5)) & 1) ? -v : v;
        }
        y = (y * norm + dense[hl * D + d]) / Ls[hl];
        store_elem(const_cast<void*>(a.out.ptr), a.out.dtype,
                   out_row + (int64_t)(h0 + h) * a.out.stride[2] + d * a.out.stride[3], y);
    }
}

// Direct path: every CTA of the cluster (the group's `splits` programs, rank = blockIdx.x) has its
// two combined states in cs. CTA `rank` merges heads [rank * hp, +hp) from all CTAs' cs through
// distributed shared memory (as merge_kernel does from global), rotates the tile part back
// (Hadamard: butterflies below 32 by warp shuffles, the rest in shared memory) and writes out.
// buf: (2 D + 1) * 8 floats of this CTA's shared memory, apart from cs.
template <int D>
__device__ void cluster_merge(const AttendArgs& a, float* cs, float* buf, int b, int h0, int nq)
{
    namespace cg = cooperative_groups;
    static_assert((D & (D - 1)) == 0 && D >= 32, "Hadamard block = D, a power of two >= 32");
    const int S = a.splits, rank = blockIdx.x;
    cg::cluster_group cl = cg::this_cluster();
    if (S > 1)
        cl.sync();  // every CTA's cs is written (release/acquire at cluster scope)
    else
        __syncthreads();
    const int hp = (nq + S - 1) / S;
    const int h_lo = min(nq, rank * hp), h_hi = min(nq, h_lo + hp);
    const int n_items = (h_hi - h_lo) * D;
    // items of one warp are 32 consecutive channels of one head (D and blockDim multiples of 32)
    for (int idx = threadIdx.x; idx < n_items; idx += blockDim.x) {
        const int hl = idx / D, d = idx % D, h = h_lo + hl;
        float mt[8], lt[8], at[8], md[8], ld[8], ad[8];
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            if (r < S) {
                const float* src = S > 1 ? cl.map_shared_rank(cs, r) : cs;
                mt[r] = src[h * (D + 2)];
                lt[r] = src[h * (D + 2) + 1];
                at[r] = src[h * (D + 2) + 2 + d];
                md[r] = src[(8 + h) * (D + 2)];
                ld[r] = src[(8 + h) * (D + 2) + 1];
                ad[r] = src[(8 + h) * (D + 2) + 2 + d];
            }
        }
        merge_splits<D>(mt, lt, at, md, ld, ad, S, hl, d, buf);
    }
    if (S > 1)
        cl.sync();  // rot/dense complete; and no CTA leaves while another still reads its cs
    else
        __syncthreads();
    merge_store<D>(a, buf, n_items, h_lo, b, h0);
}

// ---- VAR 12/14/16 epilogue on the direct path: push instead of pull ------------------------------
// (s7 profile at 4K x 1: finish_states ~914 instructions per warp -- a runtime-divided index and an
// 8-warp loop per element -- plus two cluster barriers and the owners' DSMEM reads held ~40 % of the
// samples.) Here each thread combines the warp states of one (part, head, 4 channels) -- the same
// operations in the same order as combine_warps, so the same bits -- and stores them straight into
// the shared memory of the CTA that owns the head (rank h / hp); one cluster barrier later the owner
// merges from its own shared memory exactly as cluster_merge does. CTAs that own no head leave after
// their arrive (nobody reads their shared memory). Every CTA arrived once at its start (phase 0), and
// waits for that phase before its first remote store: the cluster's CTAs are then all running.
constexpr int kRecvRows = 2 * (4 + 8 - 1);  // (rank * hp + hl) * 2 + part < 2 (nq + S - 1), nq <= 4, S <= 8
// VAR 14 / 16: rows for S splits and nq heads, 2 S ceil(nq / S) (0 beyond the direct path's 8 splits):
// next to 8 warps x 2 record stages only ~7 KB of shared memory are left.
__host__ __device__ __forceinline__ int push_recv_rows(int S, int nq)
{
    return S > 8 ? 0 : 2 * S * ((nq + S - 1) / S);
}
// Variants (attend_kernel's VAR) that run attend_early (the per-warp prologue) / push_merge's epilogue.
// The tile loops: 1 row-split (every preset; GQA > 4), 6 swapped operands with the s5 prologue and
// epilogue (s5-s7 default for > 8 tiles per program, A/B baseline), 5 swapped with attend_early (s5-s7
// default at <= 8 tiles), 12 warp pairs (s7, served), 14 = 5 + push merge + FAST (served at <= 8 tiles
// where pairs do not apply), 16 = 14 with the sink/tail share after the tiles (LATE) (s8, served).
__host__ __device__ constexpr bool attend_early_var(int v) { return v == 5 || v == 12 || v == 14 || v == 16; }
__host__ __device__ constexpr bool attend_push_var(int v) { return v == 12 || v == 14 || v == 16; }

__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// recv: kRecvRows * D acc floats, then kRecvRows * 2 (m, l) floats; buf as in cluster_merge.
template <int D>
__device__ void push_merge(const AttendArgs& a, const float* ws, int ws_floats, bool tiles_valid, int nw, int b, int h0,
                           int nq, float* recv, float* buf, int recv_rows = kRecvRows)
{
    namespace cg = cooperative_groups;
    static_assert((D & (D - 1)) == 0 && D >= 32, "Hadamard block = D, a power of two >= 32");
    constexpr int HQ = 4, NG = D / 4;
    const int S = a.splits, rank = blockIdx.x;
    const int hp = (nq + S - 1) / S;
    cg::cluster_group cl = cg::this_cluster();
    float* recv_ml = recv + recv_rows * D;
    if (S > 1) cluster_wait();  // phase 0: every CTA of the cluster has started
    for (int idx = threadIdx.x; idx < 2 * HQ * NG; idx += blockDim.x) {
        const int g4 = idx % NG, h = (idx / NG) % HQ, part = idx / (NG * HQ);
        if (h >= nq) continue;
        const float* W = ws + (size_t)part * ws_floats;
        float M = -CUDART_INF_F, L = 0.0f, v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (part == 1 || tiles_valid) {
            float mw[8];
#pragma unroll
            for (int w = 0; w < 8; ++w) mw[w] = w < nw ? W[w * 8 + h] : -CUDART_INF_F;
#pragma unroll
            for (int w = 0; w < 8; ++w) M = fmaxf(M, mw[w]);
            if (M != -CUDART_INF_F) {
#pragma unroll
                for (int w = 0; w < 8; ++w) {
                    if (w >= nw) break;
                    const float wt = exp2f(mw[w] - M);  // 0 for warps that saw nothing
                    L = fmaf(wt, W[nw * 8 + w * 8 + h], L);
                    const float4 x = *reinterpret_cast<const float4*>(W + nw * 16 + (w * 8 + h) * D + 4 * g4);
                    v[0] = fmaf(wt, x.x, v[0]);
                    v[1] = fmaf(wt, x.y, v[1]);
                    v[2] = fmaf(wt, x.z, v[2]);
                    v[3] = fmaf(wt, x.w, v[3]);
                }
            }
        }
        const int owner = h / hp, row = (rank * hp + (h - owner * hp)) * 2 + part;
        float* dst = S > 1 ? cl.map_shared_rank(recv, owner) : recv;
        *reinterpret_cast<float4*>(dst + row * D + 4 * g4) = make_float4(v[0], v[1], v[2], v[3]);
        if (g4 == 0) *reinterpret_cast<float2*>(dst + recv_rows * D + 2 * row) = make_float2(M, L);
    }
    const int h_lo = min(nq, rank * hp), h_hi = min(nq, h_lo + hp);
    if (S > 1) {
        cluster_arrive();  // release: this CTA's stores into the owners' shared memory
        if (h_lo >= h_hi) return;
        cluster_wait();  // every CTA's states for this CTA's heads are here
    } else {
        __syncthreads();
    }
    const int n_items = (h_hi - h_lo) * D;
    for (int idx = threadIdx.x; idx < n_items; idx += blockDim.x) {
        const int hl = idx / D, d = idx % D;
        float mt[8], lt[8], at[8], md[8], ld[8], ad[8];
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            if (r < S) {
                const int row = (r * hp + hl) * 2;
                const float2 t = *reinterpret_cast<const float2*>(recv_ml + 2 * row);
                const float2 u = *reinterpret_cast<const float2*>(recv_ml + 2 * row + 2);
                mt[r] = t.x;
                lt[r] = t.y;
                md[r] = u.x;
                ld[r] = u.y;
                at[r] = recv[row * D + d];
                ad[r] = recv[(row + 1) * D + d];
            }
        }
        merge_splits<D>(mt, lt, at, md, ld, ad, S, hl, d, buf);
    }
    __syncthreads();
    merge_store<D>(a, buf, n_items, h_lo, b, h0);
}

// ---- swapped operands (VAR 5, 6, 14, 16; k4v2, G = D = 128, <= 4 query heads per program) -------
// The scores as S^T = Kcodes^T (16 tokens x 16 channels, A) * (q ka)^T (16 channels x 8 columns, B),
// the output as out^T = Vcodes^T (16 channels x 16 tokens, A) * P'^T (16 tokens x 8 columns, B):
// the 8 columns of B are 4 heads x (hi, lo) parts, so no fragment row is left empty at GQA <= 4
// (the served layout puts heads in A's rows g (hi) and g + 8 (lo) and half of them are padding at
// GQA 4) -- half the MMAs (64 + 8 per product instead of 128 + 8) and half the per-score and
// per-output work per thread. Same arithmetic: codes as 1024 + code * 2^shift (here a per-ROW
// scale of A), hi on the 2^kHiGrid grid, lo = rest, accumulators starting at -1024 * (column sum
// of B) from one more MMA per k-step with A = -1024.
// Maps (g = lane / 4, c = lane % 4):
//   QK, k-step s: k = 2c+e+8f <-> channel 16s + 4c + (e+2f); m-tile m: row g <-> token 16g + 2m,
//     row g+8 <-> token 16g + 2m + 1 (x 16: the high nibble); B column n = g <-> head g/2, part g%2.
//     C: thread (g, c) gets head c, hi and lo, for tokens 16g + 2m + {0, 1}: a thread's 16 scores.
//   PV, k-step u: k = 2c+e+8f <-> token 16u + 4(e+2f) + c; m-tile mm: row g <-> channel 16g + 2mm,
//     row g+8 <-> channel 16g + 2mm + 1 (x 4^(channel % 4)); B column n = g as above, read from a
//     per-warp transpose buffer in the stage's (consumed) K-code bytes; C: head c, hi and lo, for
//     channels 16g + i.
// x = q * ka for the lane's channels 16 s2 + 4c + q (s2 < KS, q < 4; the quad holds all D), and
// the quad's q . kz and max |x| -- four partial chains each, not one 32-deep chain. Shared by the
// swapped-operand B prep (swapped_qk_b) and the row-split A prep.
template <int KS>
__device__ __forceinline__ void q_times_ka(const float* q_row, const __half* ka, const __half* kz, int c,
                                           float (&x)[KS][4], float& qz, float& amax)
{
    float amp[4] = {0.0f, 0.0f, 0.0f, 0.0f}, qzp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s2 = 0; s2 < KS; ++s2) {
        const int d0 = 16 * s2 + 4 * c;
        const float4 qv4 = *reinterpret_cast<const float4*>(q_row + d0);
        const float qv[4] = {qv4.x, qv4.y, qv4.z, qv4.w};
        float kav[4], kzv[4];
        halves_to_float<4>(*reinterpret_cast<const uint2*>(ka + d0), kav);
        halves_to_float<4>(*reinterpret_cast<const uint2*>(kz + d0), kzv);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            x[s2][i] = qv[i] * kav[i];
            qzp[i] = fmaf(qv[i], kzv[i], qzp[i]);
            amp[i] = fmaxf(amp[i], fabsf(x[s2][i]));
        }
    }
    qz = quad_sum((qzp[0] + qzp[1]) + (qzp[2] + qzp[3]));
    amax = quad_max(fmaxf(fmaxf(amp[0], amp[1]), fmaxf(amp[2], amp[3])));
}

// ---- pieces shared by tiles_swapped and tiles_pair (swapped operands, k4v2, G = D = 128) -------
// B of QK: part `part` (g % 2: hi or lo) of x = q[g/2] * ka, scaled by a power of two, for channels
// 16 s2 + 4c + q; qz_b = q[g/2] . kz; inv_s1 the inverse scale; the start values -1024 * sum_k B[k][n]
// of columns 2c (k_hi: head c's hi part) and 2c + 1 (k_lo), every row alike (one MMA per k-step with
// A = -1024, 4 chains).
template <int KS>
__device__ __forceinline__ void swapped_qk_b(const float* qb, const __half* ka, const __half* kz, int c, int part,
                                             uint32_t (&Bq)[KS][2], float& qz_b, float& inv_s1, float& k_hi, float& k_lo)
{
    constexpr uint32_t kNeg1024 = 0xE400E400u;
    float xb[KS][4], amax;
    q_times_ka<KS>(qb, ka, kz, c, xb, qz_b, amax);
    float s1;
    pow2_scale(amax, s1, inv_s1);
#pragma unroll
    for (int s2 = 0; s2 < KS; ++s2) {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float hi, lo;
            split_grid(xb[s2][q], s1, hi, lo);
            v[q] = part ? lo : hi;
        }
        Bq[s2][0] = pack_half2(__float2half_rn(v[0]), __float2half_rn(v[1]));
        Bq[s2][1] = pack_half2(__float2half_rn(v[2]), __float2half_rn(v[3]));
    }
    float kst[4][4];
#pragma unroll
    for (int h = 0; h < 4; ++h) kst[h][0] = kst[h][1] = kst[h][2] = kst[h][3] = 0.0f;
#pragma unroll
    for (int s2 = 0; s2 < KS; ++s2) mma_16816(kst[s2 % 4], kNeg1024, kNeg1024, kNeg1024, kNeg1024, Bq[s2][0], Bq[s2][1]);
    k_hi = (kst[0][0] + kst[1][0]) + (kst[2][0] + kst[3][0]);
    k_lo = (kst[0][1] + kst[1][1]) + (kst[2][1] + kst[3][1]);
}

// Scores (log2 domain) of head c for this thread's NT tokens (sc[m][0..1]: hi/lo sums of token 2m, the
// low nibble; [2..3] of token 2m + 1, the high nibble; ktv their kt) and the online softmax: m_run and
// l_run updated, alpha the old state's factor; p' = p * 2^sh2 times va split into ph + pl (B of PV);
// pz = sum p vz over the warp's tokens of head c (scaled back); inv_s2 = 2^-sh2. sh2 follows head c's own tile
// maximum, so it is uniform only over the lanes of one head (lane & 3): never exchange it between heads.
// The thread's tokens: tok0 + NT g + j (va, vz: the record's).
template <int NT>
__device__ __forceinline__ void swapped_softmax(const float (&sc)[NT / 2][4], const float (&ktv)[NT], const __half* va,
                                                const __half* vz, int tok0, int g, float inv_s1_c, float qz_c, float& m_run,
                                                float& l_run, float& alpha, float& inv_s2, float& pz, float (&ph)[NT],
                                                float (&pl)[NT])
{
    float sv[NT];
    float tmp[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int m = 0; m < NT / 2; ++m)
#pragma unroll
        for (int f = 0; f < 2; ++f) {
            const int j = 2 * m + f;
            const float unshift = inv_s1_c * (f ? 1.0f / 16.0f : 1.0f);
            sv[j] = ktv[j] * fmaf(sc[m][2 * f] + sc[m][2 * f + 1], unshift, qz_c);
            tmp[j % 4] = fmaxf(tmp[j % 4], sv[j]);
        }
    float tmax = fmaxf(fmaxf(tmp[0], tmp[1]), fmaxf(tmp[2], tmp[3]));
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
    const float m_new = fmaxf(m_run, tmax);
    alpha = fast_exp2(m_run - m_new);
    m_run = m_new;

    float vav[NT], vzv[NT];
    load_halves<NT>(va + tok0 + NT * g, vav);
    load_halves<NT>(vz + tok0 + NT * g, vzv);
    float vm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NT; ++j) vm[j % 4] = fmaxf(vm[j % 4], fabsf(vav[j]));
    float vmax = fmaxf(fmaxf(vm[0], vm[1]), fmaxf(vm[2], vm[3]));
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o));
    // p' va of the tile's largest weight in [2^14, 2^15): the tile's own maximum, not the running one (p <= 1), so
    // late tiles of a long context keep their products far above the offset codes' rounding (s64c: 25x less error)
    const int sh2 = pow2_shift(vmax * fast_exp2(tmax - m_new), 64);
    inv_s2 = exp2i(-sh2);
    const float m_adj = m_new - (float)sh2;
    float lsp[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pzp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float p = fast_exp2(sv[j] - m_adj);  // p * 2^sh2
        lsp[j % 4] += p;
        pzp[j % 4] = fmaf(p, vzv[j], pzp[j % 4]);
        split_grid(p, vav[j], ph[j], pl[j]);
    }
    l_run = fmaf(l_run, alpha, ((lsp[0] + lsp[1]) + (lsp[2] + lsp[3])) * inv_s2);  // this thread's tokens
    pz = (pzp[0] + pzp[1]) + (pzp[2] + pzp[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) pz += __shfl_xor_sync(0xffffffffu, pz, o);
    pz *= inv_s2;
}

// out = out * alpha + vc * (o + pz): o[mm] the PV accumulators (hi, lo columns) of channels 16g + 2mm
// and 16g + 2mm + 1, scaled by 4^(channel % 4) and 2^sh2; acc[i] is channel 16g + i of head c.
__device__ __forceinline__ void swapped_pv_out(const __half* vc, int g, float inv_s2, float pz, float alpha,
                                               const float (&o)[8][4], float (&acc)[16])
{
    float vcv[16];
    load_halves<16>(vc + 16 * g, vcv);
#pragma unroll
    for (int mm = 0; mm < 8; ++mm)
#pragma unroll
        for (int r8 = 0; r8 < 2; ++r8) {
            const int i = 2 * mm + r8;  // channel 16g + i, scale 4^(i % 4)
            const float unshift = inv_s2 * code_unshift<2>(i);
            const float tv = fmaf(o[mm][2 * r8] + o[mm][2 * r8 + 1], unshift, pz);
            acc[i] = fmaf(acc[i], alpha, vcv[i] * tv);
        }
}

// After the last tile: the warp's state (head c = lane % 4: m, l summed over the warp, acc of channels
// 16g + i) into ws, once every warp is done with the stages (ws overlays them).
template <int D>
__device__ __forceinline__ void swapped_store_state(float m_run, float l_run, const float (&acc)[16], int warp, int g, int c,
                                                    int nq, float* ws_m, float* ws_l, float* ws_acc)
{
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, o);
    __syncthreads();  // every warp is done with the stages: reuse them for the warp states
    if (c < nq) {
        if (g == 0) {
            ws_m[warp * 8 + c] = m_run;
            ws_l[warp * 8 + c] = l_run;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) ws_acc[(warp * 8 + c) * D + 16 * g + i] = acc[i];
    }
}

// NODIV (VAR 14, 16): stage index and phase kept as counters; the runtime k % nsw and k / nsw cost ~45
// instructions per record in front of the mbarrier wait (s8 profile at 32K x 8; A/B -2 %).
template <int KB, int VB, int G, int D, bool NODIV = false>
__device__ __forceinline__ void tiles_swapped(const AttendArgs& a, uint8_t* stages, uint64_t* my_bars, const uint8_t* pool,
                                              const int* bt, int n_my, int nsw, int R, int Hk, int t_begin, int warp,
                                              int nw, int lane, int nq, const float* qs, float* ws_m, float* ws_l,
                                              float* ws_acc)
{
    using C = AttendCfg<KB, VB, G, D>;
    static_assert(KB == 4 && VB == 2 && G == 128 && D == 128, "swapped-operand tiles: k4v2, G = D = 128");
    constexpr uint32_t kNeg1024 = 0xE400E400u;
    constexpr int kPbufRow = 288;  // bytes per B column of the transpose buffer (256 + 32: 2 wavefronts per store)
    const int g = lane >> 2, c = lane & 3;
    const int part = g & 1;
    const float* qb = qs + (g >> 1) * C::QLD;  // rows >= nq are zero
    const uint32_t sw = (uint32_t)(c & 1);
    const uint32_t sel_even = sw ? 0x1054u : 0x5410u, sel_odd = sw ? 0x3276u : 0x7632u;

    float m_run = -CUDART_INF_F, l_run = 0.0f;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.0f;

    int s_c = 0;  // NODIV: stage, phase
    uint32_t ph_c = 0;
    for (int k = 0; k < n_my; ++k) {
        const int s = NODIV ? s_c : k % nsw;
        int next_page = 0;
        if (lane == 0 && k + nsw < n_my) next_page = bt[t_begin + warp + (k + nsw) * nw];
        mbar_wait(&my_bars[s], NODIV ? ph_c : (uint32_t)((k / nsw) & 1));
        uint8_t* rec = stages + (size_t)s * R;
        const __half* ka = reinterpret_cast<const __half*>(rec + a.L.ka);
        const __half* kz = reinterpret_cast<const __half*>(rec + a.L.kz);
        const __half* kt = reinterpret_cast<const __half*>(rec + a.L.kt);
        const __half* vc = reinterpret_cast<const __half*>(rec + a.L.vc);
        const __half* va = reinterpret_cast<const __half*>(rec + a.L.va);
        const __half* vz = reinterpret_cast<const __half*>(rec + a.L.vz);
        const uint8_t* kcodes = rec + a.L.k_codes;
        const uint8_t* vcodes = rec + a.L.v_codes;
        uint8_t* pbuf = rec + a.L.k_codes;  // after the QK loop: B of the PV product

        // B of QK (channels 16 s2 + 4c + q of head g/2, part g % 2) and the start values
        uint32_t Bq[C::KS][2];
        float qz_b, inv_s1, k_hi, k_lo;
        swapped_qk_b<C::KS>(qb, ka, kz, c, part, Bq, qz_b, inv_s1, k_hi, k_lo);

        // S^T = Kcodes^T * B
        float sc[8][4];
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            sc[m][0] = sc[m][2] = k_hi;
            sc[m][1] = sc[m][3] = k_lo;
        }
#pragma unroll
        for (int s2 = 0; s2 < C::KS; ++s2) {
            Words<64> r[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) r[q].load(kcodes + (16 * s2 + 4 * c + (q ^ (int)sw)) * C::KROW + g * 8);
            uint32_t P01[16], P23[16];
            unpack_pairs<4, 64, true>(r[0].w, r[1].w, P01, sel_even, sel_odd);
            unpack_pairs<4, 64, true>(r[2].w, r[3].w, P23, sel_even, sel_odd);
#pragma unroll
            for (int m = 0; m < 8; ++m) mma_16816(sc[m], P01[2 * m], P01[2 * m + 1], P23[2 * m], P23[2 * m + 1], Bq[s2][0], Bq[s2][1]);
        }

        // Scores (log2 domain) of head c, tokens 16g + j, and the online softmax.
        const float inv_s1_c = __shfl_sync(0xffffffffu, inv_s1, 8 * c);  // lane (g = 2c, 0): head c
        const float qz_c = __shfl_sync(0xffffffffu, qz_b, 8 * c);
        float ktv[16];
        load_halves<16>(kt + 16 * g, ktv);
        float alpha, inv_s2, pz, ph[16], pl[16];
        swapped_softmax<16>(sc, ktv, va, vz, 0, g, inv_s1_c, qz_c, m_run, l_run, alpha, inv_s2, pz, ph, pl);

        // P'^T to B fragments through the transpose buffer: column n = 2c + part, reader c' gets
        // tokens 16u + 4q + c' (u = this thread's g) as halves [n][c'][u][q].
        __syncwarp();  // every lane is done with the K codes
#pragma unroll
        for (int cr = 0; cr < 4; ++cr) {
            uint2 hv, lv;
            hv.x = pack_half2(__float2half_rn(ph[cr]), __float2half_rn(ph[4 + cr]));
            hv.y = pack_half2(__float2half_rn(ph[8 + cr]), __float2half_rn(ph[12 + cr]));
            lv.x = pack_half2(__float2half_rn(pl[cr]), __float2half_rn(pl[4 + cr]));
            lv.y = pack_half2(__float2half_rn(pl[8 + cr]), __float2half_rn(pl[12 + cr]));
            *reinterpret_cast<uint2*>(pbuf + (2 * c) * kPbufRow + cr * 64 + g * 8) = hv;
            *reinterpret_cast<uint2*>(pbuf + (2 * c + 1) * kPbufRow + cr * 64 + g * 8) = lv;
        }
        __syncwarp();
        uint32_t pb[8][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 x = *reinterpret_cast<const uint4*>(pbuf + g * kPbufRow + c * 64 + i * 16);
            pb[2 * i][0] = x.x;
            pb[2 * i][1] = x.y;
            pb[2 * i + 1][0] = x.z;
            pb[2 * i + 1][1] = x.w;
        }
        float v_hi = 0.0f, v_lo = 0.0f;
        if constexpr (kSwappedPvOffset) {
            float vst[4][4];
#pragma unroll
            for (int h = 0; h < 4; ++h) vst[h][0] = vst[h][1] = vst[h][2] = vst[h][3] = 0.0f;
#pragma unroll
            for (int u = 0; u < C::US; ++u) mma_16816(vst[u % 4], kNeg1024, kNeg1024, kNeg1024, kNeg1024, pb[u][0], pb[u][1]);
            v_hi = (vst[0][0] + vst[1][0]) + (vst[2][0] + vst[3][0]);
            v_lo = (vst[0][1] + vst[1][1]) + (vst[2][1] + vst[3][1]);
        }

        // out^T = Vcodes^T * P'^T
        float o[8][4];
#pragma unroll
        for (int mm = 0; mm < 8; ++mm) {
            o[mm][0] = o[mm][2] = v_hi;
            o[mm][1] = o[mm][3] = v_lo;
        }
#pragma unroll
        for (int u = 0; u < C::US; ++u) {
            uint32_t w[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) w[q] = *reinterpret_cast<const uint32_t*>(vcodes + (16 * u + 4 * q + c) * C::VROW + 4 * g);
            uint32_t V01[16], V23[16];
            unpack_pairs<2, 32, kSwappedPvOffset>(&w[0], &w[1], V01);
            unpack_pairs<2, 32, kSwappedPvOffset>(&w[2], &w[3], V23);
#pragma unroll
            for (int mm = 0; mm < 8; ++mm) mma_16816(o[mm], V01[2 * mm], V01[2 * mm + 1], V23[2 * mm], V23[2 * mm + 1], pb[u][0], pb[u][1]);
        }
        swapped_pv_out(vc, g, inv_s2, pz, alpha, o, acc);

        fence_proxy_async();  // every lane's generic reads and writes of this stage before the async-proxy overwrite
        __syncwarp();
        if (lane == 0 && k + nsw < n_my) {
            fence_proxy_async();
            mbar_expect_tx(&my_bars[s], (uint32_t)R);
            bulk_load(stages + (size_t)s * R, pool + (size_t)next_page * Hk * R, (uint32_t)R, &my_bars[s]);
        }
        if constexpr (NODIV)
            if (++s_c == nsw) {
                s_c = 0;
                ph_c ^= 1u;
            }
    }
    swapped_store_state<D>(m_run, l_run, acc, warp, g, c, nq, ws_m, ws_l, ws_acc);
}


// ---- VAR 12: a record shared by a warp PAIR (swapped operands, k4v2, G = D = 128, <= 4 heads) ---
// Warp w = 2 pr + hf takes tokens [64 hf, 64 hf + 64) of pair pr's records as an online-softmax
// state of its own (the warp-state combine merges the two halves like any two warps): QK over 4
// of the 8 m-tiles, PV over 4 of the 8 k-steps -- half the MMAs, scores and p's per warp, so a
// record's serial latency ~halves where a warp has one record (4K x 1); both warps redo the small
// B-fragment prep of QK (q * ka, start values). Maps as tiles_swapped's, on the half's 64 tokens:
//   QK m-tile m (0..3): row g <-> token 64 hf + 8 g + 2 m, row g + 8 <-> + 1 (the high nibble):
//     thread g reads 4 bytes (8 tokens) of a K row. C: head c, tokens 64 hf + 8 g + j (j < 8).
//   PV k-step u (0..3): k = 2c+e+8f <-> token 64 hf + 16 u + 4(e+2f) + c.
// P' reaches PV's B fragments through the warp's own transpose buffer outside the stages (the
// pair's other warp may still be reading the K codes): halves [column n][c'][u][q], 144 bytes
// per column (128 + 16: conflict-free 32-bit stores and 128-bit loads). The pair's lane 0 of
// warp hf = 0 sends the copies; a stage is refilled after a named barrier of the pair.
constexpr int kPairPbufRow = 144;
constexpr int kPairPbufBytes = 8 * kPairPbufRow;

__device__ __forceinline__ void pair_bar_sync(int id)
{
    asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory");
}

template <int KB, int VB, int G, int D>
__device__ __forceinline__ void tiles_pair(const AttendArgs& a, uint8_t* stages, uint64_t* my_bars, uint8_t* pbuf,
                                           const uint8_t* pool, const int* bt, int n_my, int nsw, int R, int Hk,
                                           int t_begin, int pr, int np, int hf, int warp, int lane, int nq,
                                           const float* qs, float* ws_m, float* ws_l, float* ws_acc)
{
    using C = AttendCfg<KB, VB, G, D>;
    static_assert(KB == 4 && VB == 2 && G == 128 && D == 128, "pair tiles: k4v2, G = D = 128");
    constexpr uint32_t kNeg1024 = 0xE400E400u;
    const int g = lane >> 2, c = lane & 3;
    const int part = g & 1;
    const float* qb = qs + (g >> 1) * C::QLD;  // rows >= nq are zero
    const uint32_t sw = (uint32_t)(c & 1);
    const uint32_t sel_even = sw ? 0x1054u : 0x5410u, sel_odd = sw ? 0x3276u : 0x7632u;
    const int tok0 = 64 * hf;

    float m_run = -CUDART_INF_F, l_run = 0.0f;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.0f;

    for (int k = 0; k < n_my; ++k) {
        const int s = k % nsw;
        int next_page = 0;
        if (hf == 0 && lane == 0 && k + nsw < n_my) next_page = bt[t_begin + pr + (k + nsw) * np];
        mbar_wait(&my_bars[s], (uint32_t)((k / nsw) & 1));
        const uint8_t* rec = stages + (size_t)s * R;
        const __half* ka = reinterpret_cast<const __half*>(rec + a.L.ka);
        const __half* kz = reinterpret_cast<const __half*>(rec + a.L.kz);
        const __half* kt = reinterpret_cast<const __half*>(rec + a.L.kt);
        const __half* vc = reinterpret_cast<const __half*>(rec + a.L.vc);
        const __half* va = reinterpret_cast<const __half*>(rec + a.L.va);
        const __half* vz = reinterpret_cast<const __half*>(rec + a.L.vz);
        const uint8_t* kcodes = rec + a.L.k_codes;
        const uint8_t* vcodes = rec + a.L.v_codes;

        // B of QK and the start values (as tiles_swapped; both warps of the pair)
        uint32_t Bq[C::KS][2];
        float qz_b, inv_s1, k_hi, k_lo;
        swapped_qk_b<C::KS>(qb, ka, kz, c, part, Bq, qz_b, inv_s1, k_hi, k_lo);

        // S^T = Kcodes^T * B on this half's 4 m-tiles
        float sc[4][4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            sc[m][0] = sc[m][2] = k_hi;
            sc[m][1] = sc[m][3] = k_lo;
        }
#pragma unroll
        for (int s2 = 0; s2 < C::KS; ++s2) {
            Words<32> r[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) r[q].load(kcodes + (16 * s2 + 4 * c + (q ^ (int)sw)) * C::KROW + (tok0 >> 1) + g * 4);
            uint32_t P01[8], P23[8];
            unpack_pairs<4, 32, true>(r[0].w, r[1].w, P01, sel_even, sel_odd);
            unpack_pairs<4, 32, true>(r[2].w, r[3].w, P23, sel_even, sel_odd);
#pragma unroll
            for (int m = 0; m < 4; ++m) mma_16816(sc[m], P01[2 * m], P01[2 * m + 1], P23[2 * m], P23[2 * m + 1], Bq[s2][0], Bq[s2][1]);
        }

        // Scores (log2 domain) of head c, tokens tok0 + 8g + j, and the online softmax.
        const float inv_s1_c = __shfl_sync(0xffffffffu, inv_s1, 8 * c);  // lane (g = 2c, 0): head c
        const float qz_c = __shfl_sync(0xffffffffu, qz_b, 8 * c);
        float ktv[8];
        load_halves<8>(kt + tok0 + 8 * g, ktv);
        float alpha, inv_s2, pz, ph[8], pl[8];
        swapped_softmax<8>(sc, ktv, va, vz, tok0, g, inv_s1_c, qz_c, m_run, l_run, alpha, inv_s2, pz, ph, pl);

        // P'^T to B fragments: writer (g, c) holds tokens 8g + j = 16 (g/2) + 4 (2 (g%2) + j/4) + j%4,
        // i.e. u = g/2, q = 2 (g%2) + j/4, c' = j%4: one 32-bit word (q, q + 1) per c' and part.
        __syncwarp();  // every lane has read the previous tile's B fragments
#pragma unroll
        for (int cr = 0; cr < 4; ++cr) {
            const uint32_t hv = pack_half2(__float2half_rn(ph[cr]), __float2half_rn(ph[4 + cr]));
            const uint32_t lv = pack_half2(__float2half_rn(pl[cr]), __float2half_rn(pl[4 + cr]));
            *reinterpret_cast<uint32_t*>(pbuf + (2 * c) * kPairPbufRow + cr * 32 + g * 4) = hv;
            *reinterpret_cast<uint32_t*>(pbuf + (2 * c + 1) * kPairPbufRow + cr * 32 + g * 4) = lv;
        }
        __syncwarp();
        uint32_t pb[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint4 x = *reinterpret_cast<const uint4*>(pbuf + g * kPairPbufRow + c * 32 + i * 16);
            pb[2 * i][0] = x.x;
            pb[2 * i][1] = x.y;
            pb[2 * i + 1][0] = x.z;
            pb[2 * i + 1][1] = x.w;
        }
        float v_hi = 0.0f, v_lo = 0.0f;
        if constexpr (kSwappedPvOffset) {
            float vst[4][4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                vst[u][0] = vst[u][1] = vst[u][2] = vst[u][3] = 0.0f;
                mma_16816(vst[u], kNeg1024, kNeg1024, kNeg1024, kNeg1024, pb[u][0], pb[u][1]);
            }
            v_hi = (vst[0][0] + vst[1][0]) + (vst[2][0] + vst[3][0]);
            v_lo = (vst[0][1] + vst[1][1]) + (vst[2][1] + vst[3][1]);
        }

        // out^T = Vcodes^T * P'^T over this half's 4 k-steps
        float o[8][4];
#pragma unroll
        for (int mm = 0; mm < 8; ++mm) {
            o[mm][0] = o[mm][2] = v_hi;
            o[mm][1] = o[mm][3] = v_lo;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            uint32_t w[4];
#pragma unroll
            for (int q = 0; q < 4; ++q)
                w[q] = *reinterpret_cast<const uint32_t*>(vcodes + (tok0 + 16 * u + 4 * q + c) * C::VROW + 4 * g);
            uint32_t V01[16], V23[16];
            unpack_pairs<2, 32, kSwappedPvOffset>(&w[0], &w[1], V01);
            unpack_pairs<2, 32, kSwappedPvOffset>(&w[2], &w[3], V23);
#pragma unroll
            for (int mm = 0; mm < 8; ++mm) mma_16816(o[mm], V01[2 * mm], V01[2 * mm + 1], V23[2 * mm], V23[2 * mm + 1], pb[u][0], pb[u][1]);
        }
        swapped_pv_out(vc, g, inv_s2, pz, alpha, o, acc);

        if (k + nsw < n_my) {  // (uniform over the pair) refill this stage once both warps are done with it
            fence_proxy_async();  // every lane's generic reads of this stage before the async-proxy overwrite
            pair_bar_sync(1 + pr);
            if (hf == 0 && lane == 0) {
                fence_proxy_async();
                mbar_expect_tx(&my_bars[s], (uint32_t)R);
                bulk_load(stages + (size_t)s * R, pool + (size_t)next_page * Hk * R, (uint32_t)R, &my_bars[s]);
            }
        }
    }
    swapped_store_state<D>(m_run, l_run, acc, warp, g, c, nq, ws_m, ws_l, ws_acc);
}
// Grid (splits, Hk * q_chunks, B). Program `split` reads tiles [split * tps, ...) and its
// share of the full-precision sink + tail tokens; it writes two states: slot `split`
// (tiles, Hadamard frame) and slot `splits + split` (sink/tail, original frame).
// WARPS: the most warps a program runs (the launch bound: 8 -> up to 255 registers, 12 -> 168,
// 16 -> 128); NIPC: output n-chunks per PV pass (fewer: fewer live accumulators, more passes).
// Bytes before q in the kernel's shared memory: the warps' record stages, or (after them, same
// memory) the warp states (EARLY: two areas), the combined states cs [2][8][D + 2] and the cluster
// merge's buffer [(2 D + 1) * 8].
// PAIR (VAR 12): stages per warp pair, then each warp's transpose buffer.
template <int D, bool EARLY, bool PAIR = false>
__host__ __device__ __forceinline__ size_t attend_front_bytes(int nw, int nsw, int R)
{
    const size_t stage_bytes = PAIR ? (size_t)(nw / 2) * nsw * R + (size_t)nw * kPairPbufBytes : (size_t)nw * nsw * R;
    const size_t ws_bytes = (size_t)nw * 8 * (D + 2) * sizeof(float);
    const size_t after = (EARLY ? 2 : 1) * ws_bytes + (2 * 8 * (D + 2) + (2 * D + 1) * 8) * sizeof(float);
    const size_t front = stage_bytes > after ? stage_bytes : after;
    return (front + 127) & ~(size_t)127;
}

// PUSH: push_merge's receive area, after q and the mbarriers (written by other CTAs while this one
// may still use its stages and warp states, so apart from them).
template <int D, bool EARLY, bool PAIR = false>
__host__ __device__ __forceinline__ size_t attend_recv_offset(int nw, int nsw, int R)
{
    const size_t base = attend_front_bytes<D, EARLY, PAIR>(nw, nsw, R) + 8 * (D + 4) * sizeof(float) + (size_t)nw * (nsw > 2 ? nsw : 2) * 8;
    return (base + 15) & ~(size_t)15;
}

// VAR 5 (swapped-operand tiles, <= 4 query heads): a shorter fixed path per program. Each warp's
// lane 0 sets up its own mbarriers and sends its first record copies at once (no block barrier
// first); every lane reads q straight into registers (unrotated: its DPL channels of each head,
// for the sink/tail part) and warp w rotates head w by warp shuffles (one block barrier in all,
// not one per butterfly stage). The program's share of the sink + tail tokens is then done
// *before* the tiles, while the first records are still on their way, its state kept in
// registers; both parts' warp states are combined in one pass afterwards.
// PAIR (VAR 12): warps 2 pr and 2 pr + 1 share pair pr's records (tiles_pair), a token half each.
// PUSH (VAR 12, 14, 16): push_merge's epilogue on the direct path. FAST (the same): q by vector loads
// where q is bf16/fp16 with unit channel stride, and the sink/tail scores of a warp's U tokens x HQ
// heads reduced together (independent shuffle chains) before their online-softmax updates (same
// order); tiles_swapped with NODIV. LATE (VAR 16): the sink/tail share after the tiles instead (for
// several records per warp, where early sink/tail loads queue behind the record copies and hold the
// tiles up: s5 A/B), its first NPRE rounds' rows loaded before the tiles (they wait in registers; no
// exposed load latency at the end).
template <int KB, int VB, int G, int D, bool PAIR = false, bool PUSH = false, bool FAST = false, bool LATE = false>
__device__ __forceinline__ void attend_early(const AttendArgs& a, uint8_t* smem, float* qs, uint64_t* bars, float* ws,
                                             int ws_floats, float* cs, float* mbuf, int slot, int n_tiles, int sink_len,
                                             int tail_len, int kvh, int b, int h0, int nq, int split, int t_begin,
                                             int t_end, float* recv = nullptr, int recv_rows = kRecvRows)
{
    using C = AttendCfg<KB, VB, G, D>;
    constexpr int HQ = 4;        // query heads per program (the swapped tiles' limit)
    constexpr int DPL = D / 32;  // channels per lane
    constexpr int U = 4;
    using Vec = typename HalfVec<DPL>::T;
    const int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int Hk = a.c.num_kv_heads;
    const int R = (int)a.L.total;
    const int nsw = a.stages_per_warp;
    const int nbw = nsw > 2 ? nsw : 2;
    const bool has_tiles = t_begin < t_end;
    // record streams: one per warp, or (PAIR) one per warp pair
    const int unit = PAIR ? warp >> 1 : warp, nunits = PAIR ? nw >> 1 : nw;
    uint8_t* stages = smem + (size_t)unit * nsw * R;
    uint64_t* my_bars = bars + unit * nbw;
    const uint8_t* pool = reinterpret_cast<const uint8_t*>(a.c.pool) + (size_t)a.layer * a.c.num_pages * Hk * R +
                          (size_t)kvh * R;
    const int* bt = reinterpret_cast<const int*>(a.c.block_table) + (size_t)slot * a.c.max_tiles;
    const int n_my = t_begin + unit < t_end ? (t_end - t_begin - unit + nunits - 1) / nunits : 0;
    if constexpr (PUSH)
        if (a.direct && a.splits > 1) cluster_arrive_relaxed();  // phase 0 (push_merge waits for it)
    if (has_tiles && lane == 0 && (!PAIR || (warp & 1) == 0)) {
        for (int s = 0; s < nbw; ++s) mbar_init(&my_bars[s], 1);
        fence_proxy_async();  // the barriers' init before the copy engine uses them
        for (int s = 0; s < nsw && s < n_my; ++s) {
            const int page = bt[t_begin + unit + s * nunits];
            mbar_expect_tx(&my_bars[s], (uint32_t)R);
            bulk_load(stages + (size_t)s * R, pool + (size_t)page * Hk * R, (uint32_t)R, &my_bars[s]);
        }
    }

    // q, pre-scaled: channels lane * DPL + i of every head (rows >= nq zero)
    float qd[HQ][DPL];
    const int64_t q_row = row_offset(a.q, b, a.q_tokens);
    bool q_vec = false;
    if constexpr (FAST && DPL == 4)
        q_vec = a.q.dtype != KVARN_F32 && a.q.stride[3] == 1 && (a.q.stride[2] & 3) == 0 && (a.q.stride[1] & 3) == 0 &&
                (a.q.stride[0] & 3) == 0 &&
                (reinterpret_cast<uintptr_t>(a.q.ptr) & 7) == 0;
    if (q_vec) {  // 4 channels of a head in one 8-byte load
        const bool bf = a.q.dtype != KVARN_F16;
#pragma unroll
        for (int h = 0; h < HQ; ++h) {
            uint2 raw = make_uint2(0u, 0u);
            if (h < nq)
                raw = *reinterpret_cast<const uint2*>(reinterpret_cast<const uint16_t*>(a.q.ptr) + q_row +
                                                      (int64_t)(h0 + h) * a.q.stride[2] + lane * DPL);
            const uint32_t w2[2] = {raw.x, raw.y};
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const uint16_t bits = (uint16_t)(w2[i >> 1] >> (16 * (i & 1)));
                const float x = bf ? __bfloat162float(__ushort_as_bfloat16(bits)) : __half2float(__ushort_as_half(bits));
                qd[h][i] = h < nq ? q_scaled(x, a.scale) : 0.0f;
            }
        }
    } else {
#pragma unroll
    for (int h = 0; h < HQ; ++h)
#pragma unroll
        for (int i = 0; i < DPL; ++i)
            qd[h][i] = h < nq ? q_scaled(load_elem(a.q.ptr, a.q.dtype,
                                                   q_row + (int64_t)(h0 + h) * a.q.stride[2] +
                                                       (lane * DPL + i) * a.q.stride[3]),
                                         a.scale)
                              : 0.0f;
    }
    // the tiles' q (Hadamard frame; block = D): head r rotated by warp r, into qs
    for (int r = warp; r < 8; r += nw) {
        float x[DPL];
#pragma unroll
        for (int i = 0; i < DPL; ++i) x[i] = 0.0f;
#pragma unroll
        for (int h = 0; h < HQ; ++h)
            if (h == r)
#pragma unroll
                for (int i = 0; i < DPL; ++i) x[i] = qd[h][i];
#pragma unroll
        for (int hh = 1; hh < DPL; hh <<= 1)
#pragma unroll
            for (int i = 0; i < DPL; ++i)
                if ((i & hh) == 0) {
                    const float x0 = x[i], x1 = x[i + hh];
                    x[i] = x0 + x1;
                    x[i + hh] = x0 - x1;
                }
#pragma unroll
        for (int hh = DPL; hh < D; hh <<= 1) {
            const int lm = hh / DPL;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const float o = __shfl_xor_sync(0xffffffffu, x[i], lm);
                x[i] = (lane & lm) ? o - x[i] : x[i] + o;
            }
        }
        const float norm = rsqrtf((float)D);
#pragma unroll
        for (int i = 0; i < DPL; ++i) qs[r * C::QLD + lane * DPL + i] = x[i] * norm;
    }

    // ---- full-precision sink + tail (original frame): this program's share, one token per warp at
    // a time, U tokens' loads in flight per warp; the state stays in registers. Before the tiles
    // (VAR 5, 12, 14), or after them (LATE, VAR 16) with the first NPRE rounds' rows loaded now ----
    float m_h[HQ], l_h[HQ], acc_h[HQ][DPL];
#pragma unroll
    for (int h = 0; h < HQ; ++h) {
        m_h[h] = -CUDART_INF_F;
        l_h[h] = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; ++k) acc_h[h][k] = 0.0f;
    }
    const int n_dense = sink_len + tail_len;
    const int d_per = (n_dense + a.splits - 1) / a.splits;
    const int d_begin = min(n_dense, split * d_per), d_end = min(n_dense, d_begin + d_per);
    const int64_t dhead = ((int64_t)a.layer * a.c.num_slots + slot) * Hk + kvh;
    auto load_round = [&](int t0, Vec (&kraw)[U], Vec (&vraw)[U]) {
        load_dense_round<G, D>(a, dhead, sink_len, t0, nw, d_end, lane, kraw, vraw);
    };
    auto compute_round = [&](int t0, const Vec (&kraw)[U], const Vec (&vraw)[U]) {
        if constexpr (FAST) {
            // every (token, head) score first: U * HQ independent reduction chains
            float scs[U][HQ];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float kv[DPL];
                halves_to_float<DPL>(kraw[u], kv);
#pragma unroll
                for (int h = 0; h < HQ; ++h) {
                    float sc = 0.0f;
#pragma unroll
                    for (int k = 0; k < DPL; ++k) sc = fmaf(qd[h][k], kv[k], sc);
                    scs[u][h] = sc;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (t0 + u * nw < d_end)  // (warp-uniform) no shuffles for absent tokens
#pragma unroll
                        for (int h = 0; h < HQ; ++h) scs[u][h] += __shfl_xor_sync(0xffffffffu, scs[u][h], o);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t0 + u * nw >= d_end) break;
                float vv[DPL];
                halves_to_float<DPL>(vraw[u], vv);
#pragma unroll
                for (int h = 0; h < HQ; ++h) {
                    if (h >= nq) break;
                    const float sc = scs[u][h];
                    dense_update<DPL>(m_h[h], l_h[h], acc_h[h], sc, vv);
                }
            }
        } else {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t0 + u * nw >= d_end) break;
                float kv[DPL], vv[DPL];
                halves_to_float<DPL>(kraw[u], kv);
                halves_to_float<DPL>(vraw[u], vv);
#pragma unroll
                for (int h = 0; h < HQ; ++h) {
                    if (h >= nq) break;
                    float sc = 0.0f;
#pragma unroll
                    for (int k = 0; k < DPL; ++k) sc = fmaf(qd[h][k], kv[k], sc);
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
                    dense_update<DPL>(m_h[h], l_h[h], acc_h[h], sc, vv);
                }
            }
        }
    };
    constexpr int NPRE = LATE ? 2 : 0;  // rounds whose rows are loaded before the tiles
    Vec kpre[NPRE > 0 ? NPRE : 1][U], vpre[NPRE > 0 ? NPRE : 1][U];
    if constexpr (LATE) {
#pragma unroll
        for (int r = 0; r < NPRE; ++r) {
            const int t0 = d_begin + warp + r * U * nw;
            if (t0 < d_end) load_round(t0, kpre[r], vpre[r]);
        }
    } else {
        for (int t0 = d_begin + warp; t0 < d_end; t0 += U * nw) {
            Vec kraw[U], vraw[U];
            load_round(t0, kraw, vraw);
            compute_round(t0, kraw, vraw);
        }
    }
    __syncthreads();  // qs written; every warp's barriers initialised

    if (has_tiles) {  // ends with a block barrier, then its warp states
        if constexpr (PAIR)
            tiles_pair<KB, VB, G, D>(a, stages, my_bars, smem + (size_t)nunits * nsw * R + (size_t)warp * kPairPbufBytes,
                                     pool, bt, n_my, nsw, R, Hk, t_begin, unit, nunits, warp & 1, warp, lane, nq, qs, ws,
                                     ws + nw * 8, ws + nw * 16);
        else  // (FAST, VAR 14 / 16: NODIV)
            tiles_swapped<KB, VB, G, D, FAST>(a, stages, my_bars, pool, bt, n_my, nsw, R, Hk, t_begin, warp, nw, lane, nq,
                                              qs, ws, ws + nw * 8, ws + nw * 16);
    } else
        __syncthreads();  // (the sink/tail states below overwrite nothing in use: no stages here)
    if constexpr (LATE) {
#pragma unroll
        for (int r = 0; r < NPRE; ++r) {
            const int t0 = d_begin + warp + r * U * nw;
            if (t0 < d_end) compute_round(t0, kpre[r], vpre[r]);
        }
        for (int t0 = d_begin + warp + NPRE * U * nw; t0 < d_end; t0 += U * nw) {
            Vec kraw[U], vraw[U];
            load_round(t0, kraw, vraw);
            compute_round(t0, kraw, vraw);
        }
    }
    float* wd = ws + ws_floats;  // sink/tail warp states
#pragma unroll
    for (int h = 0; h < HQ; ++h) {
        if (h >= nq) break;
        if (lane == 0) {
            wd[warp * 8 + h] = m_h[h];
            wd[nw * 8 + warp * 8 + h] = l_h[h];
        }
#pragma unroll
        for (int k = 0; k < DPL; ++k) wd[nw * 16 + (warp * 8 + h) * D + lane * DPL + k] = acc_h[h][k];
    }
    __syncthreads();
    if constexpr (PUSH)
        if (a.direct) {
            push_merge<D>(a, ws, ws_floats, has_tiles, nw, b, h0, nq, recv, mbuf, recv_rows);
            return;
        }
    finish_states<D>(a, ws, ws_floats, 0, 2, has_tiles, nw, b, h0, nq, split, cs);
    if (a.direct) cluster_merge<D>(a, cs, mbuf, b, h0, nq);
}
template <int KB, int VB, int G, int D, int WARPS = 8, int NIPC = 16, int VAR = 1>
__global__ void __launch_bounds__(WARPS * 32, 1) attend_kernel(AttendArgs a)
{
    using C = AttendCfg<KB, VB, G, D, NIPC>;
    constexpr bool OFF = offset_codes_for<KB, VB, D>();
    constexpr float kLoWeight = lo_weight<OFF>();
    const int split = blockIdx.x, b = blockIdx.z;
    const int kvh = blockIdx.y / a.q_chunks, chunk = blockIdx.y % a.q_chunks;
    const int Hk = a.c.num_kv_heads;
    const int group_q = a.num_q_heads / Hk;
    const int h0 = kvh * group_q + chunk * 8;
    const int nq = min(8, group_q - chunk * 8);
    const int slot = a.meta[4 * b], n_tiles = a.meta[4 * b + 1];
    const int sink_len = a.meta[4 * b + 2], tail_len = a.meta[4 * b + 3];
    const int nw = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int R = (int)a.L.total;
    const int nsw = a.stages_per_warp;
    const int nbw = nsw > 2 ? nsw : 2;  // mbarriers per warp (at least 2)

    extern __shared__ __align__(128) uint8_t smem[];
    constexpr bool EARLY = attend_early_var(VAR);  // 5, 12, 14, 16: attend_early's per-warp prologue
    constexpr bool PAIR = VAR == 12;               // warp-pair tiles
    constexpr bool PUSH = attend_push_var(VAR);    // 12, 14, 16: push_merge on the direct path
    constexpr bool FAST = PUSH;                    // vector q loads, batched sink/tail scores (and NODIV tiles)
    constexpr bool LATE = VAR == 16;               // the sink/tail share after the tiles
    const size_t front = attend_front_bytes<D, EARLY, PAIR>(nw, nsw, R);
    float* qs = reinterpret_cast<float*>(smem + front);
    uint64_t* bars = reinterpret_cast<uint64_t*>(qs + 8 * C::QLD);
    // Warp states (EARLY: two areas, tiles then sink/tail), then the combined states cs and the
    // cluster merge's buffer, all written once every warp is done with its stages (same memory).
    const int ws_floats = nw * 8 * (D + 2);
    float* ws_m = reinterpret_cast<float*>(smem);
    float* ws_l = ws_m + nw * 8;
    float* ws_acc = ws_l + nw * 8;
    float* cs = ws_m + (EARLY ? 2 : 1) * ws_floats;
    float* mbuf = cs + 2 * 8 * (D + 2);
    float* recv = reinterpret_cast<float*>(smem + attend_recv_offset<D, EARLY, PAIR>(nw, nsw, R));  // PUSH only

    const int t_begin = split * a.tiles_per_split;
    const int t_end = min(t_begin + a.tiles_per_split, n_tiles);
    const bool has_tiles = t_begin < t_end;

    if constexpr (EARLY) {
        attend_early<KB, VB, G, D, PAIR, PUSH, FAST, LATE>(a, smem, qs, bars, ws_m, ws_floats, cs, mbuf, slot, n_tiles,
                                                           sink_len, tail_len, kvh, b, h0, nq, split, t_begin, t_end, recv,
                                                           PAIR ? kRecvRows : push_recv_rows(a.splits, nq));
    } else {  // VAR 1 (row-split tiles) and VAR 6 (swapped tiles, the s5-s7 path for > 8 tiles per program)

    // q for this program's heads, pre-scaled; rows >= nq are zero.
    load_q<D>(a, qs, C::QLD, b, h0, nq);
    if (has_tiles && threadIdx.x < nw * nbw) mbar_init(&bars[threadIdx.x], 1);
    fence_proxy_async();
    __syncthreads();

    if (!has_tiles) {
        finish_states<D>(a, ws_m, ws_floats, 0, 1, false, nw, b, h0, nq, split, cs);  // an empty state
    } else {
        // ---- tiles: the first records' loads go out before the q rotation ----------------
        uint8_t* stages = smem + (size_t)warp * nsw * R;
        uint64_t* my_bars = bars + warp * nbw;
        const uint8_t* pool = reinterpret_cast<const uint8_t*>(a.c.pool) +
                              (size_t)a.layer * a.c.num_pages * Hk * R + (size_t)kvh * R;
        const int* bt = reinterpret_cast<const int*>(a.c.block_table) + (size_t)slot * a.c.max_tiles;
        const int n_my = t_begin + warp < t_end ? (t_end - t_begin - warp + nw - 1) / nw : 0;
        if (lane == 0) {
            for (int s = 0; s < nsw && s < n_my; ++s) {
                const int page = bt[t_begin + warp + s * nw];
                mbar_expect_tx(&my_bars[s], (uint32_t)R);
                bulk_load(stages + (size_t)s * R, pool + (size_t)page * Hk * R, (uint32_t)R, &my_bars[s]);
            }
        }

        // Rotate q (the tiles live in the Hadamard frame).
        const int blk = hadamard_block(D), half_blk = blk / 2;
        for (int hh = 1; hh < blk; hh <<= 1) {
            for (int p = threadIdx.x; p < 8 * (D / 2); p += blockDim.x) {
                const int h = p / (D / 2), q = p % (D / 2);
                const int j = (q / half_blk) * blk + ((q % half_blk) / hh) * 2 * hh + (q % half_blk) % hh;
                float* row = qs + h * C::QLD;
                const float x0 = row[j], x1 = row[j + hh];
                row[j] = x0 + x1;
                row[j + hh] = x0 - x1;
            }
            __syncthreads();
        }
        const float norm = rsqrtf((float)blk);
        for (int idx = threadIdx.x; idx < 8 * D; idx += blockDim.x) qs[(idx / D) * C::QLD + idx % D] *= norm;
        __syncthreads();


        if constexpr (VAR == 6) {
            tiles_swapped<KB, VB, G, D>(a, stages, my_bars, pool, bt, n_my, nsw, R, Hk, t_begin, warp, nw, lane, nq, qs,
                                        ws_m, ws_l, ws_acc);
        } else {  // row-split tiles
        float m_run = -CUDART_INF_F, l_run = 0.0f;
        float acc[C::NI][2];
#pragma unroll
        for (int i = 0; i < C::NI; ++i) acc[i][0] = acc[i][1] = 0.0f;
        const float* qrow = qs + g * C::QLD;
        // QK k-step s maps k = 2c+e+8f to channel 16s + 4c + (e+2f), so a thread's four
        // channels per step are adjacent (q, ka, kz as vector loads); it reads the K code rows of
        // slot r as channel 16s + 4c + (r ^ (c & 1)) (odd c the other way round: no bank conflict
        // between lanes c and c + 1), and the byte_perm selectors put them back in order.
        const uint32_t sw = (uint32_t)(c & 1);
        const uint32_t sel_even = sw ? 0x1054u : 0x5410u, sel_odd = sw ? 0x3276u : 0x7632u;
        constexpr int kStartChains = 4;

        for (int k = 0; k < n_my; ++k) {
            const int s = k % nsw;
            // The next record's page, read now (a global load) rather than after this tile's maths.
            int next_page = 0;
            if (lane == 0 && k + nsw < n_my) next_page = bt[t_begin + warp + (k + nsw) * nw];
            mbar_wait(&my_bars[s], (uint32_t)((k / nsw) & 1));
            const uint8_t* rec = stages + (size_t)s * R;
            const __half* ka = reinterpret_cast<const __half*>(rec + a.L.ka);
            const __half* kz = reinterpret_cast<const __half*>(rec + a.L.kz);
            const __half* kt = reinterpret_cast<const __half*>(rec + a.L.kt);
            const __half* vc = reinterpret_cast<const __half*>(rec + a.L.vc);
            const __half* va = reinterpret_cast<const __half*>(rec + a.L.va);
            const __half* vz = reinterpret_cast<const __half*>(rec + a.L.vz);
            const uint8_t* kcodes = rec + a.L.k_codes;
            const uint8_t* vcodes = rec + a.L.v_codes;

            // A = q * ka (hi/lo, scaled), qz = q . kz
            float xa[C::KS][4], qz, amax;  // per head (A row): its quad holds all its channels
            q_times_ka<C::KS>(qrow, ka, kz, c, xa, qz, amax);
            float s1, inv_s1;
            pow2_scale(amax, s1, inv_s1);
            uint32_t A[C::KS][4];
#pragma unroll
            for (int s2 = 0; s2 < C::KS; ++s2) {
                const float sv4[4] = {s1, s1, s1, s1};
                split_pack4<OFF>(xa[s2], sv4, A[s2]);
            }
            float k_start[4];
            offset_start<C::KS, OFF, kStartChains>(A, k_start);

            // S = A * Kcodes
            float sc[C::NJ][4];
#pragma unroll
            for (int j = 0; j < C::NJ; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) sc[j][q] = k_start[q];
#pragma unroll
            for (int s2 = 0; s2 < C::KS; ++s2) {
                Words<C::KBITS_T> r[4];
                uint32_t B0[C::NJ], B1[C::NJ];
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    r[q].load(kcodes + (16 * s2 + 4 * c + (q ^ (int)sw)) * C::KROW + g * (C::KBITS_T / 8));
                unpack_pairs<KB, C::KBITS_T, OFF>(r[0].w, r[1].w, B0, sel_even, sel_odd);
                unpack_pairs<KB, C::KBITS_T, OFF>(r[2].w, r[3].w, B1, sel_even, sel_odd);
#pragma unroll
                for (int j = 0; j < C::NJ; ++j) mma_16816(sc[j], A[s2][0], A[s2][1], A[s2][2], A[s2][3], B0[j], B1[j]);
            }

            // Scores (log2 domain) and the online softmax for head g.
            float ktv[2][C::NJ];
            load_halves<C::NJ>(kt + C::NJ * (2 * c), ktv[0]);
            load_halves<C::NJ>(kt + C::NJ * (2 * c + 1), ktv[1]);
            float p[C::NJ][2];
            float tmp[4] = {-CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
            for (int j = 0; j < C::NJ; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float unshift = inv_s1 * code_unshift<KB>(j);
                    const float sv = ktv[e][j] * fmaf(fmaf(sc[j][2 + e], kLoWeight, sc[j][e]), unshift, qz);
                    p[j][e] = sv;
                    tmp[(j % 2) * 2 + e] = fmaxf(tmp[(j % 2) * 2 + e], sv);
                }
            const float tmax = quad_max(fmaxf(fmaxf(tmp[0], tmp[1]), fmaxf(tmp[2], tmp[3])));
            const float m_new = fmaxf(m_run, tmax);
            const float alpha = fast_exp2(m_run - m_new);
            m_run = m_new;
            float vav[2][C::NJ], vzv[2][C::NJ];
            load_halves<C::NJ>(va + C::NJ * (2 * c), vav[0]);
            load_halves<C::NJ>(va + C::NJ * (2 * c + 1), vav[1]);
            load_halves<C::NJ>(vz + C::NJ * (2 * c), vzv[0]);
            load_halves<C::NJ>(vz + C::NJ * (2 * c + 1), vzv[1]);
            float lsum = 0.0f, pz = 0.0f, vmax = 0.0f;
            float s2v, inv_s2;
            uint32_t PA[C::US][4];
            if constexpr (OFF) {
                // p' = p * 2^sh2 straight from the exp2 (m_new - sh2): P = p' * va needs no scaling
                // multiply; l and pz are scaled back once. sh2 <= 64 keeps the sums finite.
#pragma unroll
                for (int j = 0; j < C::NJ; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) vmax = fmaxf(vmax, fabsf(vav[e][j]));
                vmax = quad_max(vmax);
                // the tile's own maximum, as swapped_softmax: sh2 is per head g (its quad), not per warp
                const int sh2 = pow2_shift(vmax * fast_exp2(tmax - m_new), 64);
                inv_s2 = exp2i(-sh2);
                const float m_adj = m_new - (float)sh2;
                float lsp[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pzp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < C::NJ; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        p[j][e] = fast_exp2(p[j][e] - m_adj);
                        lsp[(j % 2) * 2 + e] += p[j][e];  // four partial chains, not one 2 NJ deep
                        pzp[(j % 2) * 2 + e] = fmaf(p[j][e], vzv[e][j], pzp[(j % 2) * 2 + e]);
                    }
                lsum = (lsp[0] + lsp[1]) + (lsp[2] + lsp[3]);
                pz = (pzp[0] + pzp[1]) + (pzp[2] + pzp[3]);
                l_run = fmaf(l_run, alpha, lsum * inv_s2);
                pz = quad_sum(pz) * inv_s2;
#pragma unroll
                for (int u = 0; u < C::US; ++u) {
                    const float pa[4] = {p[2 * u][0], p[2 * u][1], p[2 * u + 1][0], p[2 * u + 1][1]};
                    const float va4[4] = {vav[0][2 * u], vav[1][2 * u], vav[0][2 * u + 1], vav[1][2 * u + 1]};
                    split_pack4<OFF>(pa, va4, PA[u]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < C::NJ; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        p[j][e] = fast_exp2(p[j][e] - m_new);
                        lsum += p[j][e];
                        pz = fmaf(p[j][e], vzv[e][j], pz);
                        vmax = fmaxf(vmax, fabsf(vav[e][j]));
                    }
                l_run = fmaf(l_run, alpha, lsum);
                pz = quad_sum(pz);
                vmax = quad_max(vmax);
                pow2_scale(vmax, s2v, inv_s2);
#pragma unroll
                for (int u = 0; u < C::US; ++u) {
                    const float pa[4] = {p[2 * u][0] * vav[0][2 * u], p[2 * u][1] * vav[1][2 * u],
                                         p[2 * u + 1][0] * vav[0][2 * u + 1], p[2 * u + 1][1] * vav[1][2 * u + 1]};
                    const float sv4[4] = {s2v, s2v, s2v, s2v};
                    split_pack4<OFF>(pa, sv4, PA[u]);
                }
            }
            float v_start[4];
            offset_start<C::US, OFF, kStartChains>(PA, v_start);

            // out += vc * (P' * Vcodes + pz)
#pragma unroll
            for (int pass = 0; pass < C::NPASS; ++pass) {
                float o[C::NIP][4];
#pragma unroll
                for (int i = 0; i < C::NIP; ++i)
#pragma unroll
                    for (int q = 0; q < 4; ++q) o[i][q] = v_start[q];
                const int col_byte = (C::NI * g + pass * C::NIP) * VB / 8;
#pragma unroll
                for (int u = 0; u < C::US; ++u) {
                    const int rA0 = C::NJ * (2 * c) + 2 * u, rA1 = C::NJ * (2 * c + 1) + 2 * u;
                    Words<C::VBITS_T> w[4];
                    w[0].load(vcodes + rA0 * C::VROW + col_byte);
                    w[1].load(vcodes + rA1 * C::VROW + col_byte);
                    w[2].load(vcodes + (rA0 + 1) * C::VROW + col_byte);
                    w[3].load(vcodes + (rA1 + 1) * C::VROW + col_byte);
                    uint32_t B0[C::NIP], B1[C::NIP];
                    unpack_pairs<VB, C::VBITS_T, OFF>(w[0].w, w[1].w, B0);
                    unpack_pairs<VB, C::VBITS_T, OFF>(w[2].w, w[3].w, B1);
#pragma unroll
                    for (int i = 0; i < C::NIP; ++i) mma_16816(o[i], PA[u][0], PA[u][1], PA[u][2], PA[u][3], B0[i], B1[i]);
                }
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float vcv[C::NIP];
                    load_halves<C::NIP>(vc + C::NI * (2 * c + e) + pass * C::NIP, vcv);
#pragma unroll
                    for (int i = 0; i < C::NIP; ++i) {
                        const float unshift = inv_s2 * code_unshift<VB>(i);
                        const float tv = fmaf(fmaf(o[i][2 + e], kLoWeight, o[i][e]), unshift, pz);
                        acc[pass * C::NIP + i][e] = fmaf(acc[pass * C::NIP + i][e], alpha, vcv[i] * tv);
                    }
                }
            }

            __syncwarp();
            if (lane == 0 && k + nsw < n_my) {
                fence_proxy_async();  // our generic reads of this stage before the async-proxy overwrite
                mbar_expect_tx(&my_bars[s], (uint32_t)R);
                bulk_load(stages + (size_t)s * R, pool + (size_t)next_page * Hk * R, (uint32_t)R, &my_bars[s]);
            }
        }
        l_run = quad_sum(l_run);
        __syncthreads();  // every warp is done with the stages: reuse them for the warp states
        if (g < nq) {
            if (c == 0) {
                ws_m[warp * 8 + g] = m_run;
                ws_l[warp * 8 + g] = l_run;
            }
#pragma unroll
            for (int i = 0; i < C::NI; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e) ws_acc[(warp * 8 + g) * D + C::NI * (2 * c + e) + i] = acc[i][e];
        }
        }  // VAR != 6
        __syncthreads();
        finish_states<D>(a, ws_m, ws_floats, 0, 1, true, nw, b, h0, nq, split, cs);
        __syncthreads();  // the state is read out of ws before the sink/tail part reuses it
        load_q<D>(a, qs, C::QLD, b, h0, nq);  // the original frame again
        __syncthreads();
    }

    // ---- full-precision sink + tail, original frame: this program's share of the tokens,
    // one token per warp at a time, U tokens' loads in flight per warp ----
    {
        constexpr int DPL = D / 32;  // channels per lane
        constexpr int U = 4;
        using Vec = typename HalfVec<DPL>::T;
        const int n_dense = sink_len + tail_len;
        const int per = (n_dense + a.splits - 1) / a.splits;
        const int d_begin = min(n_dense, split * per), d_end = min(n_dense, d_begin + per);
        float m_h[8], l_h[8], acc_h[8][DPL];
#pragma unroll
        for (int h = 0; h < 8; ++h) {
            m_h[h] = -CUDART_INF_F;
            l_h[h] = 0.0f;
#pragma unroll
            for (int k = 0; k < DPL; ++k) acc_h[h][k] = 0.0f;
        }
        const int64_t head = ((int64_t)a.layer * a.c.num_slots + slot) * Hk + kvh;
        for (int t0 = d_begin + warp; t0 < d_end; t0 += U * nw) {
            Vec kraw[U], vraw[U];
            load_dense_round<G, D>(a, head, sink_len, t0, nw, d_end, lane, kraw, vraw);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (t0 + u * nw >= d_end) break;
                float kv[DPL], vv[DPL];
                halves_to_float<DPL>(kraw[u], kv);
                halves_to_float<DPL>(vraw[u], vv);
#pragma unroll
                for (int h = 0; h < 8; ++h) {
                    if (h >= nq) break;
                    float s = 0.0f;
#pragma unroll
                    for (int k = 0; k < DPL; ++k) s = fmaf(qs[h * C::QLD + lane * DPL + k], kv[k], s);
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                    dense_update<DPL>(m_h[h], l_h[h], acc_h[h], s, vv);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < 8; ++h) {
            if (h >= nq) break;
            if (lane == 0) {
                ws_m[warp * 8 + h] = m_h[h];
                ws_l[warp * 8 + h] = l_h[h];
            }
#pragma unroll
            for (int k = 0; k < DPL; ++k) ws_acc[(warp * 8 + h) * D + lane * DPL + k] = acc_h[h][k];
        }
    }
    __syncthreads();
    finish_states<D>(a, ws_m, ws_floats, 1, 1, true, nw, b, h0, nq, split, cs);
    if constexpr (direct_for<D, VAR>())
        if (a.direct) cluster_merge<D>(a, cs, mbuf, b, h0, nq);
    }  // !EARLY
}

template <int D, bool EARLY, bool PAIR = false, bool PUSH = false>
size_t attend_smem_bytes(int nw, int nsw, int R, int recv_rows = kRecvRows)
{
    const size_t base = attend_front_bytes<D, EARLY, PAIR>(nw, nsw, R) + 8 * (D + 4) * sizeof(float) + (size_t)nw * (nsw > 2 ? nsw : 2) * 8;
    return PUSH ? ((base + 15) & ~(size_t)15) + (size_t)recv_rows * (D + 2) * sizeof(float) : base;
}

// Per head_dim launchers (attend_d*.cu).
int launch_attend_d64(int kbits, int vbits, int group, AttendArgs& a, int batch, int max_smem, cudaStream_t stream);
int launch_attend_d128(int kbits, int vbits, int group, AttendArgs& a, int batch, int max_smem, cudaStream_t stream);
int launch_attend_d256(int kbits, int vbits, int group, AttendArgs& a, int batch, int max_smem, cudaStream_t stream);

// The most CTAs of a kernel (block, smem) in one wave on the current GPU: SMs x CTAs per SM. Cached.
inline unsigned wave_capacity(const void* kernel, int block, size_t smem)
{
    static std::mutex mu;
    static std::map<std::tuple<int, const void*, int, size_t>, unsigned> memo;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;  // no resplit
    }
    const auto key = std::make_tuple(dev, kernel, block, smem);
    std::lock_guard<std::mutex> lock(mu);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    int sms = 0, per_sm = 0;
    unsigned cap = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem) == cudaSuccess)
        cap = (unsigned)(sms * per_sm);
    (void)cudaGetLastError();
    memo[key] = cap;
    return cap;
}

// Whether the direct path (clusters of `splits` CTAs) runs in no more waves than plain CTAs would:
// cluster placement needs `splits` free SMs in one GPC. Cached per (device, kernel, splits, block, smem).
inline bool direct_fits(const void* kernel, dim3 grid, int block, size_t smem)
{
    const unsigned plain_wave = wave_capacity(kernel, block, smem);
    if (plain_wave == 0) return false;  // no occupancy answer: plain launch, which needs none
    const int S = (int)grid.x;
    if (S == 1) return true;
    static std::mutex mu;
    static std::map<std::tuple<int, const void*, unsigned, int, size_t, unsigned>, bool> memo;
    const unsigned total = grid.x * grid.y * grid.z;
    int dev = -1;  // the answer is the current GPU's: two kinds of GPU in one process must not share it
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    const auto key = std::make_tuple(dev, kernel, grid.x, block, smem, total);
    std::lock_guard<std::mutex> lock(mu);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    bool ok = false;
    int clusters = 0;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)block);
    cfg.dynamicSmemBytes = smem;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)S;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0) {
        const unsigned waves_plain = (total + plain_wave - 1) / plain_wave;
        const unsigned n_clusters = total / (unsigned)S;
        const unsigned waves_cluster = (n_clusters + (unsigned)clusters - 1) / (unsigned)clusters;
        ok = waves_cluster <= waves_plain;
    }
    (void)cudaGetLastError();  // a refused query is an answer (plain launch), not a sticky error
    memo[key] = ok;
    return ok;
}

// launch_attend_t's answer when `resplit` does not apply (nothing launched; the caller picks another variant).
constexpr int kAttendNotLaunched = -1;

// a.direct on entry: the direct path is wanted (splits <= 8); on return: whether it was launched
// (else the caller runs merge_kernel over a.states).
// resplit (VAR 12 served): launch twice the plan's splits with half its tiles each, so that every
// warp pair again has the record a warp had. Only on the direct path (the scratch is sized for the
// plan's splits) within one wave; otherwise kAttendNotLaunched.
template <int KB, int VB, int G, int D, int WARPS = 8, int NIPC = 16, int VAR = 1>
int launch_attend_t(AttendArgs& args, int batch, int max_smem, cudaStream_t stream, bool resplit = false)
{
    static_assert(AttendCfg<KB, VB, G, D, NIPC>::QLD == D + 4, "q row stride");
    constexpr bool EARLY = attend_early_var(VAR);
    constexpr bool PAIR = VAR == 12;
    constexpr bool PUSH = attend_push_var(VAR);
    constexpr int WSTEP = PAIR ? 2 : 1;  // pairs: an even warp count
    AttendArgs a = args;
    const int R = (int)a.L.total;
    // VAR 14 / 16: the receive area sized for this launch's splits (8 warps x 2 stages leave ~7 KB)
    const int rrows = PAIR ? kRecvRows : push_recv_rows(a.splits, min(8, a.num_q_heads / a.c.num_kv_heads));
    // As many warps (<= WARPS) and stages per warp (<= 2) as shared memory holds.
    int nw = WARPS, nsw = 2;
    while (nsw > 1 && attend_smem_bytes<D, EARLY, PAIR, PUSH>(nw, nsw, R, rrows) > (size_t)max_smem) --nsw;
    while (nw > WSTEP && attend_smem_bytes<D, EARLY, PAIR, PUSH>(nw, nsw, R, rrows) > (size_t)max_smem) nw -= WSTEP;
    const size_t smem = attend_smem_bytes<D, EARLY, PAIR, PUSH>(nw, nsw, R, rrows);
    if (smem > (size_t)max_smem) return resplit ? kAttendNotLaunched : KVARN_CUDA_ERR_ARGUMENT;
    a.stages_per_warp = nsw;
    auto kernel = attend_kernel<KB, VB, G, D, WARPS, NIPC, VAR>;
    if (resplit) {
        if (!a.direct || !direct_for<D, VAR>() || 2 * a.splits > 8) return kAttendNotLaunched;
        a.splits *= 2;
        a.tiles_per_split = (a.tiles_per_split + 1) / 2;
    }
    KVARN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   "attend kernel shared memory");
    dim3 grid((unsigned)a.splits, (unsigned)(a.c.num_kv_heads * a.q_chunks), (unsigned)batch);
    if (a.direct && (!direct_for<D, VAR>() || a.splits > 8 || !direct_fits(reinterpret_cast<const void*>(kernel), grid, nw * 32, smem))) a.direct = 0;
    if (resplit && (!a.direct || grid.x * grid.y * grid.z > wave_capacity(reinterpret_cast<const void*>(kernel), nw * 32, smem)))
        return kAttendNotLaunched;
    if (a.direct && a.splits > 1) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        cfg.gridDim = grid;
        cfg.blockDim = dim3((unsigned)(nw * 32));
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)a.splits;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        KVARN_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, a), "attend kernel launch (cluster)");
    } else {
        kernel<<<grid, nw * 32, smem, stream>>>(a);
    }
    KVARN_CUDA_TRY(cudaGetLastError(), "attend kernel launch");
    args.direct = a.direct;
    return KVARN_CUDA_OK;
}

}  // namespace kvarn_cuda
