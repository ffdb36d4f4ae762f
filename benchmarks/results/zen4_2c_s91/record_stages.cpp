// Fifty-first session, Zen 4 box: where an avx512 int16 k4v2 record's cycles go (warm: 16 records in L1/L2).
// Includes the library's avx512 file and times, at 3.6 GHz (this VM's clock, pipes.c), per record:
//  1. the kernel as built (a copy of attend_tiles_impl's int16 + VNNI path, impl<0>), and with each stage
//     skipped in turn (conv: the fp16 scale vectors; qprep: the query's int16 rounding; scores; weights; values;
//     acc: the output accumulation) -- a skipped stage leaves wrong numbers, only the time counts;
//  2. a variant whose int16 weights are rounded against a bound known before the exp (one pass, no wait for
//     the weights' max): changes the numbers, timed only;
//  3. a software-pipelined order (weights of record i, then query prep + scores of record i+1, then values of
//     record i), whose outputs must be bit-identical;
//  4. the fp16 kernel (attend_dense_f16_avx512) over the same 16 x 128 tokens of keys, as the ratio's baseline.
// Times in ns per record (per 128 tokens for the fp16 kernel). Build and run: run.sh (records from mkrec.py).
#include "../../../native/cpu/avx512/kernels_avx512.cpp"
#include <chrono>
#include <cstdio>
#include <vector>
namespace kvarn {
float half_to_float(uint16_t) { return 0; }
uint16_t float_to_half(float) { return 0; }
double weighted_std_double(const float*, long, const float*, int) { return 0; }
const KernelTable* scalar_kernels() { return nullptr; }
bool avx512_vnni_on() { return true; }
int score_mode() { return 1; }
}
using namespace kvarn;

// One pass: the int16 weights rounded against a bound known before the exp (the tile's largest p, exp(smax - m),
// times the record's largest va), so no second pass over the weights and no wait for their max.
template <int NH>
inline void weights_fused(float* s, int G, const float* va, const float* vz, float vamax, const __m512* smax, SoftmaxState st,
                          int h0, int D, float* pz, float* wsum, float* wscale, int32_t* w_int_sum, int16_t* w16)
{
    __m512 mv[NH], psum[NH], z[NH], wsm[NH], inv[NH];
    __m512i isum[NH];
    for (int h = 0; h < NH; ++h) {
        const int hq = h0 + h;
        const float tmax = _mm512_reduce_max_ps(smax[h]);
        softmax_rescale(tmax, st.m + hq, st.l + hq, st.acc_orig + (size_t)hq * D, st.acc_rot + (size_t)hq * D, D);
        mv[h] = _mm512_set1_ps(st.m[hq]);
        const float bound = expf(tmax - st.m[hq]) * vamax;
        wscale[h] = bound > 0.0f ? bound / 32767.0f : 0.0f;
        inv[h] = _mm512_set1_ps(inverse_scale(32767.0f, bound));
        psum[h] = z[h] = wsm[h] = _mm512_setzero_ps();
        isum[h] = _mm512_setzero_si512();
    }
    const __m512i top = _mm512_set1_epi32(32767);
    for (int t = 0; t < G; t += 16) {
        const __m512 vzt = _mm512_load_ps(vz + t), vat = _mm512_load_ps(va + t);
        for (int h = 0; h < NH; ++h) {
            const __m512 x = _mm512_sub_ps(_mm512_load_ps(s + h * G + t), mv[h]);
            const __m512 p = exp_int_mode_ps(x);
            psum[h] = _mm512_add_ps(psum[h], p);
            z[h] = _mm512_fmadd_ps(p, vzt, z[h]);
            const __m512 w = _mm512_mul_ps(p, vat);
            wsm[h] = _mm512_add_ps(wsm[h], w);
            const __m512i r = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(w, inv[h])), top);
            isum[h] = _mm512_add_epi32(isum[h], r);
            _mm256_store_si256(reinterpret_cast<__m256i*>(w16 + h * G + t), _mm512_cvtepi32_epi16(_mm512_shuffle_epi32(r, _MM_PERM_DBCA)));
        }
    }
    for (int h = 0; h < NH; ++h) {
        st.l[h0 + h] += _mm512_reduce_add_ps(psum[h]);
        pz[h] = _mm512_reduce_add_ps(z[h]);
        wsum[h] = _mm512_reduce_add_ps(wsm[h]);
        w_int_sum[h] = reduce_add_epi32_wrapping(isum[h]);
    }
}
// The record's six fp16 scale vectors as float32 (attend_tiles_impl's first step).
inline void convert_scales(const uint8_t* rec, const kvarn_record_layout& L, int D, int G, float* ka, float* kz,
                           float* vc, float* kt, float* va, float* vz)
{
    f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.ka), ka, D);
    f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.kz), kz, D);
    f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.vc), vc, D);
    f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.kt), kt, G);
    f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.va), va, G);
    f16_to_f32(reinterpret_cast<const uint16_t*>(rec + L.vz), vz, G);
}
// The int16 query rounding per head (attend_tiles_impl's, int16 mode): qa = q ka, qi16, qscale, qz = q.kz.
inline void round_queries(const float* q_rot, int nh, int D, const float* ka, const float* kz, float* qa, int16_t* qi16,
                          float* qz, float* qscale)
{
    for (int h = 0; h < nh; ++h) {
        const float* q = q_rot + (size_t)h * D;
        __m512 z = _mm512_setzero_ps(), amax = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int d = 0; d < D; d += 16) {
            const __m512 qv = _mm512_loadu_ps(q + d);
            const __m512 a = _mm512_mul_ps(qv, _mm512_load_ps(ka + d));
            _mm512_store_ps(qa + h * D + d, a);
            amax = _mm512_max_ps(amax, _mm512_abs_ps(a));
            nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
            z = _mm512_fmadd_ps(qv, _mm512_load_ps(kz + d), z);
        }
        qz[h] = _mm512_reduce_add_ps(z);
        const float qmax = 32767.0f;
        const float mx = _mm512_reduce_max_ps(amax);
        qscale[h] = nan || !(mx <= FLT_MAX) ? NAN : mx > 0.0f ? mx / qmax : 0.0f;
        const __m512 inv = _mm512_set1_ps(inverse_scale(qmax, mx));
        for (int d = 0; d < D; d += 16) {
            const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(qa + h * D + d), inv));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(qi16 + h * D + d), _mm512_cvtsepi32_epi16(r));
        }
    }
}
enum { kConv = 1, kQprep = 2, kScores = 4, kWeights = 8, kValues = 16, kAcc = 32, kFused = 64 };
template <int SKIP>
void impl(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record, int64_t n_tiles,
          int64_t tile_stride, SoftmaxState st)
{
    const int G = fmt.group, D = fmt.head_dim;
    const kvarn_record_layout L = record_layout(fmt);
    alignas(64) static float ka[KVARN_MAX_HEAD_DIM], kz[KVARN_MAX_HEAD_DIM], vc[KVARN_MAX_HEAD_DIM];
    alignas(64) static float kt[128], va[128], vz[128];
    alignas(64) static float qa[kHeadGroup * KVARN_MAX_HEAD_DIM], tmp[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(64) static int16_t qi16[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(64) static float s[kHeadGroup * 128];
    alignas(64) static int16_t w16[kHeadGroup * 128];
    alignas(64) static uint8_t w8[kHeadGroup * 128];
    static float qz[kHeadGroup], qscale[kHeadGroup];
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const uint8_t* rec = first_record + tile * tile_stride;
        Prefetcher pf{nullptr, nullptr, 0};
        if (!(SKIP & kConv)) convert_scales(rec, L, D, G, ka, kz, vc, kt, va, vz);
        bool va_negative = false;
        __m512 vmx = _mm512_setzero_ps();
        for (int t = 0; t < G; t += 16) { va_negative |= _mm512_cmp_ps_mask(_mm512_load_ps(va + t), _mm512_setzero_ps(), _CMP_LT_OQ) != 0; vmx = _mm512_max_ps(vmx, _mm512_load_ps(va + t)); }
        const float vamax = _mm512_reduce_max_ps(vmx);
        const int nh = n_q;
        if (!(SKIP & kQprep)) round_queries(q_rot, nh, D, ka, kz, qa, qi16, qz, qscale);
        __m512 smax[kHeadGroup];
        for (int h = 0; h < nh; ++h) smax[h] = _mm512_set1_ps(SKIP & kScores ? 1.0f : -INFINITY);
        const ScoreArgs args{qscale, qz, kt, G, s};
        if (!(SKIP & kScores)) scores_int16_dispatch<true>(nh, rec + L.k_codes, D, qi16, args, smax, pf);
        float pz[kHeadGroup], wscale[kHeadGroup], wsum[kHeadGroup];
        int32_t w_int_sum[kHeadGroup];
        if (SKIP & kFused)
            with_head_count(nh, [&](auto heads) {
                constexpr int NH = decltype(heads)::value;
                weights_fused<NH>(s, G, va, vz, vamax, smax, st, 0, D, pz, wsum, wscale, w_int_sum, w16);
            });
        else if (!(SKIP & kWeights))
            with_head_count(nh, [&](auto heads) {
                constexpr int NH = decltype(heads)::value;
                weights_heads<NH, true, true>(s, G, va, vz, smax, st, 0, D, false, va_negative, pz, wsum, wscale, w_int_sum, w16, w8);
            });
        else
            for (int h = 0; h < nh; ++h) { pz[h] = 0; wscale[h] = 1e-5f; wsum[h] = 1; w_int_sum[h] = 100; }
        if (!(SKIP & kValues)) values_v2_int16_dispatch<true>(nh, rec + L.v_codes, D, G, w16, w_int_sum, wscale, wsum, tmp, pf);
        if (!(SKIP & kAcc))
            for (int h = 0; h < nh; ++h) {
                float* acc = st.acc_rot + (size_t)h * D;
                const __m512 pzv = _mm512_set1_ps(pz[h]);
                for (int d = 0; d < D; d += 16) {
                    const __m512 v = _mm512_mul_ps(_mm512_load_ps(vc + d), _mm512_add_ps(_mm512_load_ps(tmp + h * D + d), pzv));
                    _mm512_storeu_ps(acc + d, _mm512_add_ps(_mm512_loadu_ps(acc + d), v));
                }
            }
    }
}
// Times are in ns; the floors come from the peak rates of vpdpwssd and vfmadd231ps (zmm) measured in the same
// round (12 independent accumulators), so no clock is assumed.
template <class F> double cycles(F f, int reps) {
    double best = 1e30;
    for (int r = 0; r < 9; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) f();
        auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double>(t1 - t0).count() / reps * 1e9);
    }
    return best;
}
// ns per record of one of the kernel variants over the 16 records (out: the softmax state after, when given).
double timed(AttendTilesFn fn, int n_q, int D, const std::vector<uint8_t>& rec, const std::vector<float>& q,
             std::vector<float>* out = nullptr)
{
    const int n_tiles = 16;
    const TileFormat fmt{4, 2, 128, D};
    const kvarn_record_layout L = record_layout(fmt);
    std::vector<float> m(n_q), l(n_q), ao(n_q * D), ar(n_q * D);
    SoftmaxState st{m.data(), l.data(), ao.data(), ar.data()};
    auto reset = [&] { for (int h = 0; h < n_q; ++h) { m[h] = -INFINITY; l[h] = 0; } std::fill(ar.begin(), ar.end(), 0.f); };
    const double c = cycles([&] { reset(); fn(q.data(), n_q, fmt, rec.data(), n_tiles, L.total, st); }, 2000) / n_tiles;
    if (out) { *out = ar; out->insert(out->end(), l.begin(), l.end()); }
    return c;
}
template <int SKIP>
double per_record(int n_q, int D, const std::vector<uint8_t>& rec, const std::vector<float>& q)
{
    return timed(impl<SKIP>, n_q, D, rec, q);
}
// Pipelined order: weights(i), then query prep + scores of unit i+1, then values(i) and acc(i): unit i+1's scores
// do not touch the softmax state, so the state sees the same operations in the same order (same bits).
void impl_pipe(const float* q_rot, int n_q, const TileFormat& fmt, const uint8_t* first_record, int64_t n_tiles,
               int64_t tile_stride, SoftmaxState st)
{
    const int G = fmt.group, D = fmt.head_dim;
    const kvarn_record_layout L = record_layout(fmt);
    struct Buf {
        alignas(64) float ka[KVARN_MAX_HEAD_DIM], kz[KVARN_MAX_HEAD_DIM], vc[KVARN_MAX_HEAD_DIM];
        alignas(64) float kt[128], va[128], vz[128];
        alignas(64) float qa[kHeadGroup * KVARN_MAX_HEAD_DIM];
        alignas(64) int16_t qi16[kHeadGroup * KVARN_MAX_HEAD_DIM];
        alignas(64) float s[kHeadGroup * 128];
        __m512 smax[kHeadGroup];
        float qz[kHeadGroup], qscale[kHeadGroup];
        bool va_negative;
    };
    alignas(64) static Buf buf[2];
    alignas(64) static float tmp[kHeadGroup * KVARN_MAX_HEAD_DIM];
    alignas(64) static int16_t w16[kHeadGroup * 128];
    alignas(64) static uint8_t w8[kHeadGroup * 128];
    const int nh = n_q;
    auto front = [&](int64_t tile, Buf& b) {
        const uint8_t* rec = first_record + tile * tile_stride;
        Prefetcher pf{nullptr, nullptr, 0};
        convert_scales(rec, L, D, G, b.ka, b.kz, b.vc, b.kt, b.va, b.vz);
        b.va_negative = false;
        for (int t = 0; t < G; t += 16) b.va_negative |= _mm512_cmp_ps_mask(_mm512_load_ps(b.va + t), _mm512_setzero_ps(), _CMP_LT_OQ) != 0;
        round_queries(q_rot, nh, D, b.ka, b.kz, b.qa, b.qi16, b.qz, b.qscale);
        for (int h = 0; h < nh; ++h) b.smax[h] = _mm512_set1_ps(-INFINITY);
        const ScoreArgs args{b.qscale, b.qz, b.kt, G, b.s};
        scores_int16_dispatch<true>(nh, rec + L.k_codes, D, b.qi16, args, b.smax, pf);
    };
    if (n_tiles > 0) front(0, buf[0]);
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        Buf& b = buf[tile & 1];
        const uint8_t* rec = first_record + tile * tile_stride;
        Prefetcher pf{nullptr, nullptr, 0};
        float pz[kHeadGroup], wscale[kHeadGroup], wsum[kHeadGroup];
        int32_t w_int_sum[kHeadGroup];
        with_head_count(nh, [&](auto heads) {
            constexpr int NH = decltype(heads)::value;
            weights_heads<NH, true, true>(b.s, G, b.va, b.vz, b.smax, st, 0, D, false, b.va_negative, pz, wsum, wscale, w_int_sum, w16, w8);
        });
        if (tile + 1 < n_tiles) front(tile + 1, buf[(tile + 1) & 1]);
        values_v2_int16_dispatch<true>(nh, rec + L.v_codes, D, G, w16, w_int_sum, wscale, wsum, tmp, pf);
        for (int h = 0; h < nh; ++h) {
            float* acc = st.acc_rot + (size_t)h * D;
            const __m512 pzv = _mm512_set1_ps(pz[h]);
            for (int d = 0; d < D; d += 16) {
                const __m512 v = _mm512_mul_ps(_mm512_load_ps(b.vc + d), _mm512_add_ps(_mm512_load_ps(tmp + h * D + d), pzv));
                _mm512_storeu_ps(acc + d, _mm512_add_ps(_mm512_loadu_ps(acc + d), v));
            }
        }
    }
}
double fp16_per_128(int n_q, int D, const std::vector<float>& q)
{
    const int n = 16 * 128;
    std::vector<uint16_t> k((size_t)n * D);
    char name[32]; snprintf(name, sizeof name, "k%d.bin", D);
    FILE* f = fopen(name, "rb"); if (!f || fread(k.data(), 2, k.size(), f) != k.size()) exit(1); fclose(f);
    std::vector<float> m(n_q), l(n_q), ao(n_q * D), ar(n_q * D);
    SoftmaxState st{m.data(), l.data(), ao.data(), ar.data()};
    auto reset = [&] { for (int h = 0; h < n_q; ++h) { m[h] = -INFINITY; l[h] = 0; } std::fill(ao.begin(), ao.end(), 0.f); };
    // the keys' bits serve as values too: only the time counts
    return cycles([&] { reset(); attend_dense_f16_avx512(q.data(), n_q, D, k.data(), k.data(), n, D, st); }, 2000) / 16;
}
#define R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define PEAK(INSN) [] { long n = 10000000L; const auto t0 = std::chrono::steady_clock::now(); \
    __asm__ volatile("vpxord %%zmm20,%%zmm20,%%zmm20\n vpxord %%zmm21,%%zmm21,%%zmm21\n1:\n" R12(INSN) "dec %0\n jnz 1b" : "+r"(n) :: "memory", \
                     "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm20","xmm21"); \
    return 12 * 1e7 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9; }
#define DPW(i) "vpdpwssd %%zmm20, %%zmm21, %%zmm" #i "\n"
#define FMA(i) "vfmadd231ps %%zmm20, %%zmm21, %%zmm" #i "\n"
int main()
{
    for (int cfg = 0; cfg < 2; ++cfg) {
        const int n_q = cfg ? 4 : 3, D = cfg ? 128 : 64;
        const TileFormat fmt{4, 2, 128, D};
        const kvarn_record_layout L = record_layout(fmt);
        std::vector<uint8_t> rec((size_t)16 * L.total);
        char name[32]; snprintf(name, sizeof name, "rec%d.bin", D);
        FILE* f = fopen(name, "rb"); if (!f || fread(rec.data(), 1, rec.size(), f) != rec.size()) return 1; fclose(f);
        std::vector<float> q(n_q * D);
        for (int i = 0; i < n_q * D; ++i) q[i] = 0.05f * ((i * 37) % 41 - 20);
        const double dpwssd = 2.0 * (D / 2) * 2 * n_q * 4, fma16 = 2.0 * 128 * D * n_q / 16;
        printf("== %d query heads per KV head, head_dim %d: %.0f vpdpwssd per record, %.0f FMAs per 128 tokens in the fp16 kernel\n",
               n_q, D, dpwssd, fma16);
        for (int round = 0; round < 3; ++round) {
            std::vector<float> a, b;
            double dpw_rate = 0, fma_rate = 0;  // per ns, best of 5
            for (int i = 0; i < 5; ++i) dpw_rate = std::max(dpw_rate, PEAK(DPW)()), fma_rate = std::max(fma_rate, PEAK(FMA)());
            const double all = timed(impl<0>, n_q, D, rec, q, &a), piped = timed(impl_pipe, n_q, D, rec, q, &b);
            const double fp16 = fp16_per_128(n_q, D, q);
            printf("round %d (peaks: %.2f vpdpwssd, %.2f FMA per ns): record %.0f ns (floor %.0f: %.0f%%); fp16 kernel %.0f ns per 128 tokens (floor %.0f: %.0f%%); ratio %.2f\n",
                   round, dpw_rate, fma_rate, all, dpwssd / dpw_rate, 100 * dpwssd / dpw_rate / all, fp16, fma16 / fma_rate,
                   100 * fma16 / fma_rate / fp16, fp16 / all);
            printf("  without: conv %.0f, qprep %.0f, scores %.0f, weights %.0f, values %.0f, acc %.0f; scores alone %.0f, values alone %.0f\n",
                   per_record<kConv>(n_q, D, rec, q), per_record<kQprep>(n_q, D, rec, q), per_record<kScores>(n_q, D, rec, q),
                   per_record<kWeights>(n_q, D, rec, q), per_record<kValues>(n_q, D, rec, q), per_record<kAcc>(n_q, D, rec, q),
                   per_record<kConv | kQprep | kWeights | kAcc | kValues>(n_q, D, rec, q),
                   per_record<kConv | kQprep | kWeights | kAcc | kScores>(n_q, D, rec, q));
            printf("  one-pass bounded weights %.0f (%.3fx); pipelined %.0f (%.3fx), outputs %s\n",
                   per_record<kFused>(n_q, D, rec, q), all / per_record<kFused>(n_q, D, rec, q), piped, all / piped,
                   memcmp(a.data(), b.data(), a.size() * 4) == 0 ? "bit-identical" : "DIFFER");
        }
    }
}
