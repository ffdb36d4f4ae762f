// Native check of every ISA's kernel table against scalar, meant for ASan/UBSan:
// every buffer is its own exact-size heap allocation, so an over-read in a
// vector tail is caught. Built and run by scripts/asan.sh (target kvarn_simd_test, native/cpu/CMakeLists.txt).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kvarn/kernels.h"
#include "kvarn/kvarn.h"

using namespace kvarn;

static int failures = 0;
static bool quiet = false;  // int score modes: run for bounds only
#define CHECK(cond, ...)                                        \
    do {                                                        \
        if (!(cond) && !quiet) {                                \
            ++failures;                                         \
            std::printf("FAIL %s:%d ", __FILE__, __LINE__);     \
            std::printf(__VA_ARGS__);                           \
            std::printf("\n");                                  \
        }                                                       \
    } while (0)

template <typename T>
std::unique_ptr<T[]> exact(size_t n)  // exactly n elements: ASan sees one past the end
{
    return std::unique_ptr<T[]>(new T[n]);
}

static std::mt19937 gen(7);
static float randn() { return std::normal_distribution<float>(0.0f, 1.0f)(gen); }

struct State {
    std::vector<float> m, l, ao, ar;
    State(int nq, int D) : m(nq, -INFINITY), l(nq, 0.0f), ao((size_t)nq * D, 0.0f), ar((size_t)nq * D, 0.0f) {}
    SoftmaxState view() { return {m.data(), l.data(), ao.data(), ar.data()}; }
};

static double max_rel(const State& a, const State& b)
{
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < a.ao.size(); ++i) {
        const double x = (a.ao[i] + a.ar[i]) / a.l[i / (a.ao.size() / a.l.size())];
        const double y = (b.ao[i] + b.ar[i]) / b.l[i / (b.ao.size() / b.l.size())];
        num = std::fmax(num, std::fabs(x - y));
        den = std::fmax(den, std::fabs(y));
    }
    return num / den;
}

static void check_table(const KernelTable* t)
{
    const KernelTable* s = scalar_kernels();
    std::printf("== %s\n", t->name);
    // fp16 input conversion: bit-identical to scalar on every finite fp16 value, and for float32
    // rounded to fp16 on every tie between neighbouring fp16 values, the values one float32 ulp
    // either side of it, and each fp16 value itself (subnormals and +-65504 included); odd
    // lengths exercise the vector tails.
    {
        std::vector<uint16_t> halves;
        std::vector<float> floats;
        for (uint32_t h = 0; h < 0x10000; ++h) {
            if ((h & 0x7c00u) == 0x7c00u) continue;  // inf / NaN: never passed
            halves.push_back((uint16_t)h);
            const float f = half_to_float((uint16_t)h);
            floats.push_back(f);
            if ((h & 0x7fffu) != 0x7bffu) {  // not the largest: the tie with the next one up
                const float up = half_to_float((uint16_t)(h + 1));
                const float tie = (float)(((double)f + (double)up) / 2);
                floats.insert(floats.end(), {tie, std::nextafter(tie, -INFINITY), std::nextafter(tie, INFINITY)});
            }
        }
        for (size_t n : {halves.size(), (size_t)7, (size_t)1}) {
            auto src = exact<uint16_t>(n);
            auto a = exact<float>(n), b = exact<float>(n);
            std::memcpy(src.get(), halves.data(), n * sizeof(uint16_t));
            s->to_float(src.get(), KVARN_INPUT_F16, a.get(), (int64_t)n);
            t->to_float(src.get(), KVARN_INPUT_F16, b.get(), (int64_t)n);
            CHECK(!std::memcmp(a.get(), b.get(), n * sizeof(float)), "to_float f16 n=%zu", n);
        }
        for (size_t n : {floats.size(), (size_t)13}) {
            auto src = exact<float>(n);
            auto a = exact<float>(n), b = exact<float>(n);
            std::memcpy(src.get(), floats.data(), n * sizeof(float));
            s->to_float(src.get(), KVARN_INPUT_F32_AS_F16, a.get(), (int64_t)n);
            t->to_float(src.get(), KVARN_INPUT_F32_AS_F16, b.get(), (int64_t)n);
            CHECK(!std::memcmp(a.get(), b.get(), n * sizeof(float)), "to_float f32 as f16 n=%zu", n);
        }
    }
    // Hadamard: bit-identical.
    for (int D : {16, 48, 64, 80, 128, 1024})
        for (int rows : {1, 2, 3, 5}) {
            auto a = exact<float>((size_t)rows * D), b = exact<float>((size_t)rows * D);
            for (int i = 0; i < rows * D; ++i) a[i] = b[i] = randn();
            s->hadamard_f32(a.get(), rows, D);
            t->hadamard_f32(b.get(), rows, D);
            CHECK(!std::memcmp(a.get(), b.get(), sizeof(float) * rows * D), "hadamard D=%d rows=%d", D, rows);
        }
    // Quantiser inputs converted as the rotation loads them (binary16 bits; float32 rounded to binary16): the
    // scalar's records (which convert first), and the SIMD kernel's own records of the converted float32 input;
    // D 256 and 512 take the convert-then-transform path (blocks beyond the in-register ones).
    for (int D : {16, 48, 64, 80, 128, 240, 256, 512}) {
        const TileFormat fmt{4, 2, 128, D};
        const size_t n = (size_t)fmt.group * D, rec = record_layout(fmt).total;
        auto k = exact<float>(n), v = exact<float>(n), kf = exact<float>(n), vf = exact<float>(n);
        auto kh = exact<uint16_t>(n), vh = exact<uint16_t>(n);
        for (size_t i = 0; i < n; ++i) {
            k[i] = randn() * (i % D < 4 ? 8.0f : 1.0f) + 1.0f / 4096;  // not all representable in binary16
            v[i] = randn();
            kh[i] = float_to_half(k[i]), vh[i] = float_to_half(v[i]);
            kf[i] = half_to_float(kh[i]), vf[i] = half_to_float(vh[i]);
        }
        auto want = exact<uint8_t>(rec), a = exact<uint8_t>(rec), b = exact<uint8_t>(rec), c = exact<uint8_t>(rec);
        CHECK(t->quantize_tile(kf.get(), vf.get(), KVARN_INPUT_F32, fmt, 8, want.get(), kQuantizeKV) == 0, "D=%d", D);
        CHECK(s->quantize_tile(kh.get(), vh.get(), KVARN_INPUT_F16, fmt, 8, a.get(), kQuantizeKV) == 0, "D=%d", D);
        CHECK(t->quantize_tile(kh.get(), vh.get(), KVARN_INPUT_F16, fmt, 8, b.get(), kQuantizeKV) == 0, "D=%d", D);
        CHECK(t->quantize_tile(k.get(), v.get(), KVARN_INPUT_F32_AS_F16, fmt, 8, c.get(), kQuantizeKV) == 0, "D=%d", D);
        CHECK(!std::memcmp(a.get(), want.get(), rec) && !std::memcmp(b.get(), want.get(), rec) &&
                  !std::memcmp(c.get(), want.get(), rec),
              "quantize from binary16 input D=%d: scalar %d, simd %d, rounded float32 %d", D,
              !std::memcmp(a.get(), want.get(), rec), !std::memcmp(b.get(), want.get(), rec),
              !std::memcmp(c.get(), want.get(), rec));
    }
    const int fmts[][3] = {{4, 2, 128}, {4, 4, 128}, {4, 2, 64}, {2, 2, 128}, {8, 8, 128}, {4, 8, 64}};
    for (auto& f : fmts)
        for (int D : {16, 48, 64, 80, 128, 240}) {  // 80, 240: avx512's 64-channel chunks then a 16-channel tail
            const TileFormat fmt{f[0], f[1], f[2], D};
            const size_t G = fmt.group, rec = record_layout(fmt).total;
            // Quantise 3 tiles: identical records.
            const int T = 3;
            const size_t stride = rec + 64;  // records strided apart, as in a cache with heads
            auto k = exact<float>(G * D), v = exact<float>(G * D);
            auto ra = exact<uint8_t>(stride * T), rb = exact<uint8_t>(stride * T);
            std::memset(ra.get(), 0, stride * T);
            std::memset(rb.get(), 0, stride * T);
            for (int tile = 0; tile < T; ++tile) {
                for (size_t i = 0; i < G * D; ++i) {
                    k[i] = randn() * (i % D < 4 ? 8.0f : 1.0f);
                    v[i] = randn();
                }
                const int sa = s->quantize_tile(k.get(), v.get(), KVARN_INPUT_F32, fmt, 8, ra.get() + tile * stride,
                                                kQuantizeKV);
                const int sb = t->quantize_tile(k.get(), v.get(), KVARN_INPUT_F32, fmt, 8, rb.get() + tile * stride,
                                                kQuantizeKV);
                CHECK(sa == 0 && sb == 0, "quantize k%dv%d g%d D=%d status %d / %d", f[0], f[1], f[2], D, sa, sb);
            }
            CHECK(!std::memcmp(ra.get(), rb.get(), stride * T), "quantize k%dv%d g%d D=%d", f[0], f[1], f[2], D);
            // Keys too large for fp16 scales (60000 + N(0, 1)) beside ordinary values: a K+V call reports the K half
            // as the scalar does (a mutation audit, h45: a SIMD status that kept only V's went unnoticed).
            auto big = exact<float>(G * D);
            auto scratch = exact<uint8_t>(rec);
            for (size_t i = 0; i < G * D; ++i) big[i] = 60000.0f + randn();
            const int ka = s->quantize_tile(big.get(), v.get(), KVARN_INPUT_F32, fmt, 0, scratch.get(), kQuantizeKV);
            const int kb = t->quantize_tile(big.get(), v.get(), KVARN_INPUT_F32, fmt, 0, scratch.get(), kQuantizeKV);
            CHECK(ka == 1 && kb == 1, "quantize k%dv%d g%d D=%d: overflowing keys, status %d / %d", f[0], f[1], f[2], D,
                  ka, kb);
            // Attention over the tiles for several head counts.
            for (int nq : {1, 2, 3, 4, 5, 9}) {
                auto q = exact<float>((size_t)nq * D);
                for (int i = 0; i < nq * D; ++i) q[i] = randn() * 0.2f;
                State a(nq, D), b(nq, D);
                s->attend_tiles(q.get(), nq, fmt, ra.get(), T, stride, a.view());
                t->attend_tiles(q.get(), nq, fmt, ra.get(), T, stride, b.view());
                const double e = max_rel(a, b);
                CHECK(e < 1e-4, "attend_tiles k%dv%d g%d D=%d nq=%d err=%g", f[0], f[1], f[2], D, nq, e);
            }
        }
    // Dense fp16 attention: odd token counts and row strides.
    for (int D : {16, 64, 80, 128})
        for (int n : {1, 2, 3, 7, 15, 17, 31, 33, 63, 65, 127, 129})
            for (int nq : {1, 3, 4, 6}) {
                const int64_t rs = D + 16;
                auto kk = exact<uint16_t>((size_t)(n - 1) * rs + D), vv = exact<uint16_t>((size_t)(n - 1) * rs + D);
                for (size_t i = 0; i < (size_t)(n - 1) * rs + D; ++i) {
                    kk[i] = float_to_half(randn());
                    vv[i] = float_to_half(randn());
                }
                auto q = exact<float>((size_t)nq * D);
                for (int i = 0; i < nq * D; ++i) q[i] = randn() * 0.2f;
                State a(nq, D), b(nq, D);
                s->attend_dense_f16(q.get(), nq, D, kk.get(), vv.get(), n, rs, a.view());
                t->attend_dense_f16(q.get(), nq, D, kk.get(), vv.get(), n, rs, b.view());
                const double e = max_rel(a, b);
                CHECK(e < 1e-5, "dense D=%d n=%d nq=%d err=%g", D, n, nq, e);
            }
}

int main()
{
    for (const char* name : {"avx2", "avx512"}) {
        if (!kvarn_isa_available(name)) {
            std::printf("== %s: not available here, skipped\n", name);
            continue;
        }
        kvarn_set_isa(name);
        const KernelTable* t = !std::strcmp(name, "avx2") ? avx2_kernels() : avx512_kernels();
        // A table can leave entries to the lower ISA (dispatch merges them; none does today).
        KernelTable full = *t;
        if (!full.quantize_tile) full.quantize_tile = avx2_kernels()->quantize_tile;
        if (!full.to_float) full.to_float = avx2_kernels()->to_float;
        // The exact (float) arithmetic first: int16 is the default wherever it runs.
        kvarn_set_score_mode(0);
        check_table(&full);
        // Bounds are what matters here: run the int paths over every format under ASan
        // (with VNNI where the CPU has it, and the vpmaddwd forms); their accuracy is
        // checked in tests/test_simd.py.
        // (and avx512 with VBMI's byte permutes where the CPU has them, and without).
        for (int vbmi : {1, 0}) {
            if (!vbmi && !kvarn_vbmi()) continue;  // no VBMI in use here: the first pass ran the forms without it
            kvarn_set_vbmi(vbmi);
            for (int vnni : {1, 0}) {
                kvarn_set_vnni(vnni);
                for (int mode : {1, 2}) {
                    if (kvarn_set_score_mode(mode) != KVARN_OK) continue;
                    if (kvarn_score_mode() != mode) continue;  // int8 where it cannot run is int16: done
                    std::printf("   score mode %d, vnni %d (in use: %d), vbmi in use %d: bounds only\n", mode, vnni,
                                kvarn_vnni(), kvarn_vbmi());
                    quiet = true;
                    check_table(&full);
                    quiet = false;
                }
            }
        }
        kvarn_set_vbmi(1);
        kvarn_set_vnni(1);
        kvarn_set_score_mode(0);
    }
    std::printf(failures ? "%d FAILURES\n" : "all SIMD kernels match scalar\n", failures);
    return failures ? 1 : 0;
}
