// libFuzzer target for the kvarn C ABI (include/kvarn/kvarn.h). Built and run by scripts/fuzz.sh
// with -fsanitize=fuzzer,address,undefined against the native CPU sources.
//
// Each input is decoded (FuzzedDataProvider) into: the process settings (ISA, score mode, VNNI),
// then one call of an entry point with plausible-sized but arbitrary arguments, and bytes for
// the data (tile records with any fp16 fields, fp16 tokens, float queries / tiles / matrices
// with NaN, Inf and huge values). Every buffer is its own exact-size heap allocation (pointer at
// a chosen offset from malloc's, so that its end is the allocation's end): ASan sees any access
// past it. Sizes are what the header says the shapes need, never less: an out-of-bounds report
// is the library's. Besides the sanitizers the harness checks what kvarn.h promises:
//   - a call that returns KVARN_ERR_ARGUMENT / KVARN_ERR_ISA has written no output buffer, and
//     an argument the header calls invalid gives KVARN_ERR_ARGUMENT;
//   - kvarn_attend: KVARN_OK -> every output finite; KVARN_ERR_OVERFLOW -> some output not
//     finite; a NaN in an attended record's fp16 fields -> KVARN_ERR_OVERFLOW (every ISA and
//     score mode); in the integer score modes an Inf in ka on 4-bit keys or a negative va on
//     2-bit values -> KVARN_ERR_OVERFLOW; the same call twice gives the same bits; a cache
//     quantised from moderate finite data, attended with moderate queries, gives KVARN_OK and
//     (float / int16 modes) matches a float64 reference over the dequantised cache;
//   - kvarn_quantize_tiles(_typed): KVARN_OK -> every fp16 field of every record finite;
//     KVARN_ERR_OVERFLOW -> *bad_tile in range; on finite input the records (and status,
//     bad tile) equal the scalar ISA's, and fp16 inputs give the records of their float32 values;
//   - kvarn_hadamard_f32 / kvarn_dequantize_tiles: bit-identical to the scalar ISA (NaNs as
//     NaNs); H(H(x)) ~ x; dequantised values finite when the record's fields are;
//   - kvarn_balance: scales finite and in [exp(-0.3), exp(10)] for a finite matrix;
//   - kvarn_scan_f32 / kvarn_scan_f16: *max_abs and the fp16 copy against a reference, out
//     written exactly when the header says;
//   - the settings: kvarn_active_isa / kvarn_score_mode / kvarn_vnni / kvarn_vbmi report what was set.
// A failed check prints "INVARIANT <id>: ..." and aborts (libFuzzer saves the input).
// Environment: KVARN_FUZZ_ISA=scalar|avx2|avx512 fixes the ISA (else the input picks it);
// KVARN_FUZZ_SKIP=id,id,... turns checks off (to go on fuzzing past a known finding);
// KVARN_FUZZ_VERBOSE=1 prints each decoded call; KVARN_FUZZ_STATS=1 counts the checks run (at exit).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"

namespace {

// ---- reporting ----------------------------------------------------------------------------
bool g_verbose = false;
std::string g_skip;          // ",id,id,"
const char* g_forced_isa = nullptr;
const char* g_op = "?";      // the entry point under test (for reports)

bool skipped(const char* id) { return g_skip.find(std::string(",") + id + ",") != std::string::npos; }

[[noreturn]] __attribute__((format(printf, 2, 3))) void fail(const char* id, const char* fmt, ...)
{
    std::fprintf(stderr, "INVARIANT %s (op %s, isa %s, score mode %d, vnni %d, vbmi %d): ", id, g_op, kvarn_active_isa(),
                 kvarn_score_mode(), kvarn_vnni(), kvarn_vbmi());
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
    std::abort();
}

#define CHECK(id, cond, ...)                                 \
    do {                                                     \
        if (!(cond) && !skipped(id)) fail(id, __VA_ARGS__);  \
    } while (0)

// KVARN_FUZZ_STATS=1: counts of the checks that ran with their premise true, printed at exit
// (how often a corpus exercises each invariant).
bool g_stats = false;
std::vector<std::pair<std::string, long>> g_counts;
void note(const char* what)
{
    if (!g_stats) return;
    for (auto& c : g_counts)
        if (c.first == what) {
            ++c.second;
            return;
        }
    g_counts.emplace_back(what, 1);
}
void print_stats()
{
    std::sort(g_counts.begin(), g_counts.end());
    for (auto& c : g_counts) std::fprintf(stderr, "[stats] %-40s %ld\n", c.first.c_str(), c.second);
}

void vlog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void vlog(const char* fmt, ...)
{
    if (!g_verbose) return;
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
}

// ---- exact-size buffers --------------------------------------------------------------------
// bytes at malloc's pointer + offset; the allocation ends where the buffer does.
struct Buf {
    uint8_t* mem = nullptr;
    uint8_t* p = nullptr;
    size_t n = 0;
    Buf() = default;
    Buf(size_t bytes, size_t offset) { alloc(bytes, offset); }
    void alloc(size_t bytes, size_t offset)
    {
        std::free(mem);
        mem = static_cast<uint8_t*>(std::malloc(bytes + offset ? bytes + offset : 1));
        if (!mem) std::abort();
        p = mem + offset;
        n = bytes;
    }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    ~Buf() { std::free(mem); }
    template <typename T>
    T* as() const { return reinterpret_cast<T*>(p); }
    std::vector<uint8_t> snapshot() const { return std::vector<uint8_t>(p, p + n); }
    bool same(const std::vector<uint8_t>& s) const { return s.size() == n && (n == 0 || !std::memcmp(p, s.data(), n)); }
};

// ---- binary16 (the harness's own conversions) ---------------------------------------------
float h2f(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0) {
        f = std::ldexp((float)m, -24);
    } else if (e == 31) {
        f = m ? NAN : INFINITY;
    } else {
        f = std::ldexp((float)(m | 0x400u), (int)e - 25);
    }
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t f2h(float f)  // round to nearest even, overflow to Inf
{
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520
    if (a >= 0x38800000u) return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
    const double q = std::nearbyint((double)std::fabs(f) * 16777216.0);  // subnormal units of 2^-24, ties to even
    return (uint16_t)(sign | (uint16_t)q);
}

bool h_finite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }
bool h_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }

// ---- value generation ------------------------------------------------------------------------
struct Gen {
    FuzzedDataProvider& fdp;
    uint64_t s;
    explicit Gen(FuzzedDataProvider& f) : fdp(f), s(0x9e3779b97f4a7c15ull) {}
    uint64_t next()
    {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    double uni() { return (double)(next() >> 11) * 0x1p-53; }
    float gauss() { return (float)((uni() + uni() + uni() + uni() - 2.0) * 1.7320508); }
    void reseed() { s = fdp.ConsumeIntegral<uint64_t>() | 1; }
    template <typename T>
    T range(T lo, T hi) { return fdp.ConsumeIntegralInRange<T>(lo, hi); }
    bool flag() { return fdp.ConsumeBool(); }
    bool rarely() { return fdp.ConsumeIntegralInRange<int>(0, 15) == 0; }  // ~1 in 16 (0 when the input ran out)
};

const float kSpecialF[] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 65504.0f, -65504.0f, 65520.0f,
                           65519.996f, -65520.0f, 1e30f, -1e30f, 1e-45f, -1e-45f, FLT_MIN, 0.0f, -0.0f, 1.0f,
                           -1.0f, 5.9604645e-8f, 2.9802322e-8f, 6.1035156e-5f, 1e10f, -1e15f, 3e38f, 60000.0f,
                           32768.0f, 1e-20f, 0.5f, 1.5f, 2.5f};
const float kFiniteF[] = {65504.0f, -65504.0f, 1e-45f, -1e-45f, FLT_MIN, 0.0f, -0.0f, 1.0f, -1.0f, 5.9604645e-8f,
                          2.9802322e-8f, 6.1035156e-5f, 0.5f, 1.5f, 2.5f, 100.0f, -1000.0f, 1e-3f, 1e-8f, 0.1f};
const uint16_t kSpecialH[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00, 0x7fff, 0x7bff, 0xfbff, 0x0001, 0x8001,
                              0x0000, 0x8000, 0x3c00, 0xbc00, 0x0400, 0x03ff, 0x7800, 0x5bff, 0x1400, 0xc000};

float special_f(Gen& g, bool finite_only)
{
    if (finite_only) return kFiniteF[g.range<size_t>(0, sizeof(kFiniteF) / sizeof(float) - 1)];
    return kSpecialF[g.range<size_t>(0, sizeof(kSpecialF) / sizeof(float) - 1)];
}

void fill_f32_aligned(Gen& g, float* x, size_t n, bool finite_only, float cap);
void fill_f16_aligned(Gen& g, uint16_t* x, size_t n, bool finite_only, float cap);

// Fills n floats at dst (any alignment: the harness's tests of misaligned pointers write through memcpy).
// finite_only: no NaN / Inf, |x| <= cap.
void fill_f32(Gen& g, void* dst, size_t n, bool finite_only = false, float cap = FLT_MAX)
{
    std::vector<float> x(n);
    fill_f32_aligned(g, x.data(), n, finite_only, cap);
    if (n) std::memcpy(dst, x.data(), n * 4);
}

void fill_f16(Gen& g, void* dst, size_t n, bool finite_only = false, float cap = 65504.0f)
{
    std::vector<uint16_t> x(n);
    fill_f16_aligned(g, x.data(), n, finite_only, cap);
    if (n) std::memcpy(dst, x.data(), n * 2);
}

void fill_f32_aligned(Gen& g, float* x, size_t n, bool finite_only, float cap)
{
    if (!n) return;
    g.reseed();
    const int kind = g.range<int>(0, 7);
    const int e = finite_only ? g.range<int>(-30, 10) : g.range<int>(-40, 40);
    const float scale = std::ldexp(1.0f, e);
    switch (kind) {
        case 0:
        default:
            for (size_t i = 0; i < n; ++i) x[i] = g.gauss() * scale;
            break;
        case 1: {  // outlier channels (the keys of real models)
            const size_t period = (size_t)g.range<int>(1, 128);
            const float big = std::ldexp(1.0f, g.range<int>(0, 20));
            for (size_t i = 0; i < n; ++i) x[i] = g.gauss() * scale * (i % period == 0 ? big : 1.0f);
            break;
        }
        case 2:  // random bit patterns
            for (size_t i = 0; i < n; ++i) {
                uint32_t b = (uint32_t)g.next();
                if (finite_only && ((b >> 23) & 0xffu) == 0xffu) b &= ~(1u << 30);
                std::memcpy(&x[i], &b, 4);
            }
            break;
        case 3: {  // a constant
            const float c = g.flag() ? special_f(g, finite_only) : g.gauss() * scale;
            for (size_t i = 0; i < n; ++i) x[i] = c;
            break;
        }
        case 4: {  // the input's own bytes, repeated
            std::vector<uint8_t> raw = g.fdp.ConsumeBytes<uint8_t>(std::min<size_t>(n * 4, 512));
            if (raw.size() < 4) raw.assign(4, 0x3c);
            const size_t m = raw.size() / 4;
            for (size_t i = 0; i < n; ++i) std::memcpy(&x[i], raw.data() + 4 * (i % m), 4);
            if (finite_only)
                for (size_t i = 0; i < n; ++i)
                    if (!std::isfinite(x[i])) x[i] = 0.0f;
            break;
        }
        case 5:  // small integers times a power of two (exact ties for the RTN and fp16 rounding)
            for (size_t i = 0; i < n; ++i) x[i] = (float)((int)(g.next() % 17) - 8) * scale;
            break;
        case 6: {  // an offset plus noise (60000 + N(0,1): too large for fp16 scales)
            const float off = g.flag() ? special_f(g, finite_only) : std::ldexp(1.0f, g.range<int>(-10, 17));
            for (size_t i = 0; i < n; ++i) x[i] = off + g.gauss() * scale;
            break;
        }
        case 7:  // mostly zeros, a few values
            for (size_t i = 0; i < n; ++i) x[i] = (g.next() % 16 == 0) ? g.gauss() * scale : 0.0f;
            break;
    }
    const int overrides = g.range<int>(0, 8);
    for (int k = 0; k < overrides; ++k) {
        const size_t i = g.fdp.ConsumeIntegral<uint32_t>() % n;
        x[i] = special_f(g, finite_only);
    }
    if (finite_only)
        for (size_t i = 0; i < n; ++i) {
            if (!std::isfinite(x[i])) x[i] = 0.0f;
            x[i] = std::max(-cap, std::min(cap, x[i]));
        }
}

void fill_f16_aligned(Gen& g, uint16_t* x, size_t n, bool finite_only, float cap)
{
    if (!n) return;
    g.reseed();
    const int kind = g.range<int>(0, 4);
    const float scale = std::ldexp(1.0f, g.range<int>(-24, 16));
    switch (kind) {
        case 0:
        default:
            for (size_t i = 0; i < n; ++i) x[i] = f2h(g.gauss() * scale);
            break;
        case 1:
            for (size_t i = 0; i < n; ++i) x[i] = (uint16_t)g.next();
            break;
        case 2: {
            const uint16_t c = g.flag() ? kSpecialH[g.range<size_t>(0, sizeof(kSpecialH) / 2 - 1)] : f2h(g.gauss() * scale);
            for (size_t i = 0; i < n; ++i) x[i] = c;
            break;
        }
        case 3: {
            std::vector<uint8_t> raw = g.fdp.ConsumeBytes<uint8_t>(std::min<size_t>(n * 2, 512));
            if (raw.size() < 2) raw.assign(2, 0x3c);
            const size_t m = raw.size() / 2;
            for (size_t i = 0; i < n; ++i) std::memcpy(&x[i], raw.data() + 2 * (i % m), 2);
            break;
        }
        case 4: {
            const size_t period = (size_t)g.range<int>(1, 64);
            for (size_t i = 0; i < n; ++i) x[i] = f2h(g.gauss() * scale * (i % period == 0 ? 64.0f : 1.0f));
            break;
        }
    }
    const int overrides = g.range<int>(0, 6);
    for (int k = 0; k < overrides; ++k) {
        const size_t i = g.fdp.ConsumeIntegral<uint32_t>() % n;
        x[i] = kSpecialH[g.range<size_t>(0, sizeof(kSpecialH) / 2 - 1)];
    }
    if (finite_only)
        for (size_t i = 0; i < n; ++i) {
            float f = h2f(x[i]);
            if (!std::isfinite(f)) f = 0.0f;
            x[i] = f2h(std::max(-cap, std::min(cap, f)));
        }
}

// ---- record formats --------------------------------------------------------------------------
struct Fmt {
    int kbits, vbits, group, head_dim;
};

bool fmt_ok(const Fmt& f)
{
    return kvarn_bits_supported(f.kbits) && kvarn_bits_supported(f.vbits) && kvarn_group_supported(f.group) &&
           kvarn_head_dim_supported(f.head_dim);
}

const int kHeadDims[] = {16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 208, 240, 256, 320, 384, 496, 512, 768, 1008, 1024};
const int kBadHeadDims[] = {0, -16, 8, 17, 24, 1040, 1025, 2048, INT32_MIN, INT32_MAX, 15};

// A head dim; small ones most of the time (time per exec), up to max_d. *valid says whether it is supported.
int pick_head_dim(Gen& g, int max_d, bool allow_invalid, bool* valid)
{
    *valid = true;
    const int r = g.range<int>(0, 31);
    if (allow_invalid && r == 31) {
        *valid = false;
        return kBadHeadDims[g.range<size_t>(0, sizeof(kBadHeadDims) / sizeof(int) - 1)];
    }
    int d;
    if (r < 24) {
        d = kHeadDims[r % 14];  // <= 256
    } else if (r < 28) {
        d = 16 * g.range<int>(1, 64);
    } else {
        d = kHeadDims[g.range<size_t>(0, sizeof(kHeadDims) / sizeof(int) - 1)];
    }
    while (d > max_d) d = std::max(16, (d / 2) / 16 * 16);
    return d;
}

int pick_bits(Gen& g, bool allow_invalid, bool* valid)
{
    const int r = g.range<int>(0, 15);
    if (allow_invalid && r == 15) {
        const int bad[] = {0, 1, 3, 16, -4, 6};
        *valid = false;
        return bad[g.range<int>(0, 5)];
    }
    const int ok[] = {4, 2, 8, 4, 2};
    return ok[r % 5];
}

int pick_group(Gen& g, bool allow_invalid, bool* valid)
{
    const int r = g.range<int>(0, 15);
    if (allow_invalid && r == 15) {
        const int bad[] = {0, 32, 256, 96, -128, 65};
        *valid = false;
        return bad[g.range<int>(0, 5)];
    }
    return r % 3 == 0 ? 128 : 64;
}

// num_threads: mostly 1 (the fuzzer's worker shares 2 cores); *valid: <= KVARN_MAX_THREADS.
int32_t pick_threads(Gen& g, bool allow_invalid, bool* valid)
{
    *valid = true;
    const int r = g.range<int>(0, 15);
    if (allow_invalid && r == 15) {
        *valid = false;
        return g.flag() ? KVARN_MAX_THREADS + 1 : INT32_MAX;
    }
    const int32_t t[] = {1, 1, 1, 1, 1, 1, 2, 2, 0, 3, -1, INT32_MIN, 4, KVARN_MAX_THREADS, 1};
    const int32_t v = t[r % 15];
    return v == KVARN_MAX_THREADS ? 2 : v;  // 4096 threads would only slow the run down; the bound is tested above
}

// Fills n records (record i at rec + i * stride; the bytes between them as well): any bytes, or
// plausible ones (random codes, fp16 fields of a distribution per field) with fuzzer-placed specials.
void fill_records(Gen& g, uint8_t* base, size_t span, const Fmt& f, int64_t n_heads, int64_t head_stride,
                  int64_t n_tiles, int64_t tile_stride)
{
    g.reseed();
    for (size_t i = 0; i < span; ++i) base[i] = (uint8_t)g.next();
    if (!fmt_ok(f) || n_tiles <= 0 || n_heads <= 0) return;
    const kvarn_record_layout L = kvarn_layout(f.kbits, f.vbits, f.group, f.head_dim);
    const int mode = g.range<int>(0, 3);
    const size_t off[6] = {L.ka, L.kz, L.kt, L.vc, L.va, L.vz};
    const int len[6] = {f.head_dim, f.head_dim, f.group, f.head_dim, f.group, f.group};
    if (mode != 0) {
        // plausible fields: per field a power-of-two scale, positive (ka, kt, vc, va) or signed (kz, vz)
        int e[6];
        bool neg[6];
        for (int k = 0; k < 6; ++k) {
            e[k] = g.range<int>(-14, 15);
            neg[k] = (k == 1 || k == 5) || g.rarely();
        }
        for (int64_t h = 0; h < n_heads; ++h)
            for (int64_t t = 0; t < n_tiles; ++t) {
                uint8_t* rec = base + h * head_stride + t * tile_stride;
                for (int k = 0; k < 6; ++k) {
                    for (int i = 0; i < len[k]; ++i) {
                        float v = g.gauss() * std::ldexp(1.0f, e[k]);
                        if (!neg[k]) v = std::fabs(v) + std::ldexp(1.0f, e[k] - 4);
                        const uint16_t hv = f2h(v);
                        std::memcpy(rec + off[k] + 2 * (size_t)i, &hv, 2);
                    }
                }
                if (mode == 2) {  // codes: a constant byte, or all zero / all max
                    const uint8_t c = g.rarely() ? 0xff : (uint8_t)(g.next() & 0x11);
                    std::memset(rec + L.k_codes, c, L.ka - L.k_codes);
                    std::memset(rec + L.v_codes, c, L.vc - L.v_codes);
                }
            }
    }
    // specials in chosen fields of chosen records
    const int overrides = g.range<int>(0, 6);
    for (int k = 0; k < overrides; ++k) {
        const int field = g.range<int>(0, 5);
        const int64_t h = g.range<int64_t>(0, n_heads - 1), t = g.range<int64_t>(0, n_tiles - 1);
        const int i = g.range<int>(0, len[field] - 1);
        uint16_t hv = kSpecialH[g.range<size_t>(0, sizeof(kSpecialH) / 2 - 1)];
        if (g.rarely()) hv = f2h(-std::fabs(h2f(hv)));  // negative scales
        std::memcpy(base + h * head_stride + t * tile_stride + off[field] + 2 * (size_t)i, &hv, 2);
    }
}

// What kvarn_attend's header says about a record's fields.
struct RecordFacts {
    bool nan = false;        // a NaN in any fp16 field
    bool inf_ka = false;     // an Inf in ka
    bool neg_va = false;     // va < 0
    bool all_finite = true;  // every field finite
};

void record_facts(const uint8_t* rec, const Fmt& f, RecordFacts& r)
{
    const kvarn_record_layout L = kvarn_layout(f.kbits, f.vbits, f.group, f.head_dim);
    auto field = [&](size_t off, int n, auto fn) {
        for (int i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, rec + off + 2 * (size_t)i, 2);
            fn(h);
        }
    };
    auto common = [&](uint16_t h) {
        if (h_nan(h)) r.nan = true;
        if (!h_finite(h)) r.all_finite = false;
    };
    field(L.ka, f.head_dim, [&](uint16_t h) {
        common(h);
        if ((h & 0x7fffu) == 0x7c00u) r.inf_ka = true;
    });
    field(L.kz, f.head_dim, common);
    field(L.kt, f.group, common);
    field(L.vc, f.head_dim, common);
    field(L.va, f.group, [&](uint16_t h) {
        common(h);
        if (!h_nan(h) && h2f(h) < 0.0f) r.neg_va = true;
    });
    field(L.vz, f.group, common);
}

// ---- process settings ----------------------------------------------------------------------
std::string g_isa;  // the ISA this input runs under

void set_isa_or_die(const char* name)
{
    const int rc = kvarn_set_isa(name);
    CHECK("settings", rc == KVARN_OK, "kvarn_set_isa(%s) = %d though kvarn_isa_available", name, rc);
    CHECK("settings", !std::strcmp(kvarn_active_isa(), name), "kvarn_active_isa %s after kvarn_set_isa(%s)",
          kvarn_active_isa(), name);
}

// Runs fn under the scalar ISA (score mode untouched), then restores this input's ISA.
template <typename F>
void under_scalar(F&& fn)
{
    set_isa_or_die("scalar");
    fn();
    set_isa_or_die(g_isa.c_str());
}

void configure(Gen& g)
{
    const uint8_t cfg = g.fdp.ConsumeIntegral<uint8_t>();
    const char* names[] = {"scalar", "avx2", "avx512"};
    const char* isa = g_forced_isa ? g_forced_isa : names[cfg % 3];
    if (!kvarn_isa_available(isa)) isa = "scalar";
    g_isa = isa;
    set_isa_or_die(isa);
    const int vnni = (cfg >> 4) & 1;
    kvarn_set_vnni(vnni);
    const int vbmi = (cfg >> 5) & 1;
    kvarn_set_vbmi(vbmi);
    const int mode = (cfg >> 2) % 3;
    const int rc = kvarn_set_score_mode(mode);
    const bool has_avx2 = kvarn_isa_available("avx2");
    CHECK("settings", rc == (mode == 0 || has_avx2 ? KVARN_OK : KVARN_ERR_ISA), "kvarn_set_score_mode(%d) = %d", mode, rc);
    // What the header says kvarn_score_mode and kvarn_vnni report.
    const bool scalar = g_isa == "scalar";
    int want = scalar ? 0 : mode;
    if (!scalar && mode == 2 && g_isa == "avx512" && !(vnni && kvarn_cpu_has_vnni())) want = 1;
    if (rc == KVARN_OK) CHECK("settings", kvarn_score_mode() == want, "kvarn_score_mode %d, expected %d", kvarn_score_mode(), want);
    const int want_vnni = scalar ? 0 : g_isa == "avx512" ? (vnni && kvarn_cpu_has_vnni()) : (vnni && kvarn_cpu_has_avx_vnni());
    CHECK("settings", kvarn_vnni() == want_vnni, "kvarn_vnni %d, expected %d", kvarn_vnni(), want_vnni);
    const int want_vbmi = g_isa == "avx512" && vbmi && kvarn_cpu_has_vbmi();
    CHECK("settings", kvarn_vbmi() == want_vbmi, "kvarn_vbmi %d, expected %d", kvarn_vbmi(), want_vbmi);
    vlog("[config] isa %s mode %d vnni %d vbmi %d\n", g_isa.c_str(), kvarn_score_mode(), kvarn_vnni(), kvarn_vbmi());
}

// Compare two float arrays bit for bit, any NaN equal to any NaN.
bool same_bits_nan(const float* a, const float* b, size_t n, size_t* where)
{
    for (size_t i = 0; i < n; ++i) {
        if (std::isnan(a[i]) && std::isnan(b[i])) continue;
        if (std::memcmp(&a[i], &b[i], 4)) {
            *where = i;
            return false;
        }
    }
    return true;
}

// ---- kvarn_hadamard_f32 / f64 ------------------------------------------------------------------
void fuzz_hadamard(Gen& g, bool f64)
{
    g_op = f64 ? "kvarn_hadamard_f64" : "kvarn_hadamard_f32";
    bool valid = true;
    const int32_t D = pick_head_dim(g, 1024, true, &valid);
    int64_t rows = g.range<int64_t>(0, 6);
    const size_t elem = f64 ? 8 : 4;
    size_t offset = 0;
    bool null = false;
    switch (g.range<int>(0, 15)) {
        case 12: offset = f64 ? 4 : 2, valid = false; break;   // misaligned
        case 13: offset = 1, valid = false; break;
        case 14: rows = -g.range<int64_t>(1, 3), valid = false; break;
        case 15: null = true, valid = valid && rows == 0; break;
        case 11: rows = INT64_MAX / 4, valid = false; break;  // more than fits in PTRDIFF_MAX bytes
        default: break;
    }
    if (offset == 0 && f64 && g.rarely()) offset = 8;  // 8-aligned, fine
    const size_t n = (valid && rows > 0 && D > 0) ? (size_t)rows * (size_t)D : (size_t)g.range<int>(0, 64);
    Buf x(n * elem, offset);
    if (f64) {
        std::vector<float> tmp(n);
        fill_f32(g, tmp.data(), n);
        for (size_t i = 0; i < n; ++i) {
            const double d = (double)tmp[i] * (g.rarely() ? 1e300 : 1.0);
            std::memcpy(x.p + 8 * i, &d, 8);
        }
    } else {
        fill_f32(g, x.as<float>(), n);
    }
    const auto before = x.snapshot();
    vlog("[%s] rows %lld D %d offset %zu null %d valid %d\n", g_op, (long long)rows, D, offset, null, valid);
    const int rc = f64 ? kvarn_hadamard_f64(null ? nullptr : x.as<double>(), rows, D)
                       : kvarn_hadamard_f32(null ? nullptr : x.as<float>(), rows, D);
    if (!valid) {
        note("hadamard: invalid arguments");
        CHECK("hadamard-arg", rc == KVARN_ERR_ARGUMENT, "invalid arguments (rows %lld, D %d, offset %zu) gave %d",
              (long long)rows, D, offset, rc);
        CHECK("untouched", x.same(before), "x written by a call returning %d", rc);
        return;
    }
    CHECK("hadamard-ok", rc == KVARN_OK, "valid call (rows %lld, D %d) gave %d", (long long)rows, D, rc);
    if (null || rows == 0) return;
    // H is its own inverse: H(H(x)) ~ x where no overflow can occur.
    bool moderate = true;
    double mx = 0;
    for (size_t i = 0; i < n; ++i) {
        double v;
        if (f64) {
            std::memcpy(&v, before.data() + 8 * i, 8);
        } else {
            float fv;
            std::memcpy(&fv, before.data() + 4 * i, 4);
            v = fv;
        }
        if (!std::isfinite(v) || std::fabs(v) > 1e30) moderate = false;
        mx = std::max(mx, std::fabs(v));
    }
    if (!f64 && g_isa != "scalar") {
        std::vector<float> ref(n);
        std::memcpy(ref.data(), before.data(), n * 4);
        int rs = -1;
        under_scalar([&] { rs = kvarn_hadamard_f32(ref.data(), rows, D); });
        size_t where = 0;
        note("hadamard: compared with scalar");
        CHECK("hadamard-scalar", rs == KVARN_OK && same_bits_nan(ref.data(), x.as<float>(), n, &where),
              "rows %lld D %d: %s differs from scalar at %zu (%a vs %a)", (long long)rows, D, g_isa.c_str(), where,
              x.as<float>()[where], ref[where]);
    }
    if (moderate) {
        const int rc2 = f64 ? kvarn_hadamard_f64(x.as<double>(), rows, D) : kvarn_hadamard_f32(x.as<float>(), rows, D);
        CHECK("hadamard-ok", rc2 == KVARN_OK, "second call %d", rc2);
        double err = 0;
        for (size_t i = 0; i < n; ++i) {
            double a, b;
            if (f64) {
                std::memcpy(&a, before.data() + 8 * i, 8);
                b = x.as<double>()[i];
            } else {
                float fa;
                std::memcpy(&fa, before.data() + 4 * i, 4);
                a = fa;
                b = x.as<float>()[i];
            }
            err = std::max(err, std::fabs(a - b));
        }
        const double tol = (f64 ? 1e-13 : 1e-5) * mx * 16 + (f64 ? 0 : 1e-38);
        note("hadamard: H(H(x)) checked");
        CHECK("hadamard-inverse", err <= tol, "rows %lld D %d: |H(H(x)) - x| = %g, max |x| %g", (long long)rows, D, err, mx);
    }
}

// ---- kvarn_quantize_tiles(_typed) ---------------------------------------------------------------
// One quantise call; the records buffer comes back in rec, the status and bad tile in rc / bad.
struct QArgs {
    const void* k;
    const void* v;
    int32_t input_type;  // -1: the kvarn_quantize_tiles wrapper
    int64_t n_tiles;
    Fmt f;
    int32_t iters;
    int32_t threads;
};

int call_quantize(const QArgs& a, uint8_t* records, int64_t* bad)
{
    if (a.input_type == -1)
        return kvarn_quantize_tiles(static_cast<const float*>(a.k), static_cast<const float*>(a.v), a.n_tiles, a.f.kbits,
                                    a.f.vbits, a.f.group, a.f.head_dim, a.iters, records, a.threads, bad);
    return kvarn_quantize_tiles_typed(a.k, a.v, a.input_type, a.n_tiles, a.f.kbits, a.f.vbits, a.f.group, a.f.head_dim,
                                      a.iters, records, a.threads, bad);
}

// A tile format for the quantise / dequantise calls: bits, group and head_dim, any of which may be
// unsupported (valid turns false: the call must refuse it).
Fmt pick_tile_format(Gen& g, bool& valid)
{
    bool ok = true;
    Fmt f;
    f.kbits = pick_bits(g, true, &ok);
    valid = valid && ok;
    f.vbits = pick_bits(g, true, &ok);
    valid = valid && ok;
    f.group = pick_group(g, true, &ok);
    valid = valid && ok;
    f.head_dim = pick_head_dim(g, 1024, true, &ok);
    valid = valid && ok;
    return f;
}

void fuzz_quantize(Gen& g)
{
    g_op = "kvarn_quantize_tiles_typed";
    bool valid = true;
    const Fmt f = pick_tile_format(g, valid);
    const int G = kvarn_group_supported(f.group) ? f.group : 64;
    const int D = kvarn_head_dim_supported(f.head_dim) ? f.head_dim : 16;
    int64_t n_tiles = g.range<int64_t>(0, 3);
    n_tiles = std::min<int64_t>(n_tiles, std::max<int64_t>(1, (1 << 17) / ((int64_t)G * D)));
    int32_t iters = g.range<int32_t>(0, 12);
    if (g.rarely() && (int64_t)G * D * n_tiles <= 64 * 64) iters = g.range<int32_t>(13, KVARN_MAX_SINKHORN_ITERS);
    int32_t input_type = g.range<int32_t>(-1, 2);
    bool thr_ok = true;
    const int32_t threads = pick_threads(g, true, &thr_ok);
    valid = valid && thr_ok;
    size_t k_off = 0, v_off = 0, rec_off = 0, bad_off = 0;
    bool null_k = false, null_v = false, null_rec = false, null_bad = g.flag();
    const size_t elem = input_type == KVARN_INPUT_F16 ? 2 : 4;
    switch (g.range<int>(0, 31)) {
        case 20: iters = g.flag() ? -1 : KVARN_MAX_SINKHORN_ITERS + 1, valid = false; break;
        case 21: input_type = g.flag() ? 3 : -7, valid = false; break;
        case 22: n_tiles = -g.range<int64_t>(1, 5), valid = false; break;
        case 23: k_off = elem == 2 ? 1 : 2, valid = false; break;  // misaligned (refused even with no tiles)
        case 24: v_off = 1, valid = false; break;
        case 25: rec_off = 1, valid = false; break;
        case 26: null_k = true, valid = valid && n_tiles == 0; break;
        case 27: null_rec = true, valid = valid && n_tiles == 0; break;
        case 28: bad_off = 4, null_bad = false, valid = false; break;
        case 29: n_tiles = INT64_MAX / 2, valid = false; break;
        case 30: null_v = true, valid = valid && n_tiles == 0; break;
        case 31: rec_off = 2, k_off = elem, v_off = elem * 3; break;  // aligned enough: fine
        default: break;
    }
    const size_t tile_elems = (size_t)G * D;
    const size_t n_alloc = (n_tiles > 0 && n_tiles <= 3) ? (size_t)n_tiles : 0;
    const kvarn_record_layout L = kvarn_layout(kvarn_bits_supported(f.kbits) ? f.kbits : 4,
                                               kvarn_bits_supported(f.vbits) ? f.vbits : 2, G, D);
    // Buffers as the (possibly invalid) shape says, with the supported stand-ins for a bad format.
    const size_t in_bytes = n_alloc * tile_elems * elem;
    Buf k(in_bytes, k_off), v(in_bytes, v_off);
    const bool finite_in = g.flag();
    const bool cap_f16 = g.flag();  // |x| <= 65504 (the F32_AS_F16 contract)
    if (elem == 2) {
        fill_f16(g, k.as<uint16_t>(), in_bytes / 2, finite_in);
        fill_f16(g, v.as<uint16_t>(), in_bytes / 2, finite_in);
    } else {
        const float cap = cap_f16 ? 65504.0f : FLT_MAX;
        fill_f32(g, k.as<float>(), in_bytes / 4, finite_in, cap);
        fill_f32(g, v.as<float>(), in_bytes / 4, finite_in, cap);
    }
    const size_t rec_bytes = n_alloc * L.total;
    Buf rec(rec_bytes, rec_off);
    g.reseed();
    for (size_t i = 0; i < rec_bytes; ++i) rec.p[i] = (uint8_t)g.next();
    Buf bad(sizeof(int64_t), bad_off);
    const int64_t bad_init = -12345;
    std::memcpy(bad.p, &bad_init, 8);
    const auto rec_before = rec.snapshot();

    QArgs a{null_k ? nullptr : k.p, null_v ? nullptr : v.p, input_type, n_tiles, f, iters, threads};
    int64_t* badp = null_bad ? nullptr : reinterpret_cast<int64_t*>(bad.p);
    g_op = input_type == -1 ? "kvarn_quantize_tiles" : "kvarn_quantize_tiles_typed";
    vlog("[%s] type %d n %lld k%d v%d g%d D%d iters %d threads %d offs %zu/%zu/%zu/%zu nulls %d%d%d%d valid %d\n", g_op,
         input_type, (long long)n_tiles, f.kbits, f.vbits, f.group, f.head_dim, iters, threads, k_off, v_off, rec_off,
         bad_off, null_k, null_v, null_rec, null_bad, valid);
    const int rc = call_quantize(a, null_rec ? nullptr : rec.p, badp);
    vlog("  -> %s status %d\n", g_op, rc);
    int64_t bad_after;
    std::memcpy(&bad_after, bad.p, 8);
    if (!valid) {
        note("quantize: invalid arguments");
        CHECK("quantize-arg", rc == KVARN_ERR_ARGUMENT, "invalid arguments gave %d", rc);
        CHECK("untouched", rec.same(rec_before) && bad_after == bad_init, "outputs written by a call returning %d", rc);
        return;
    }
    note(rc == KVARN_OK ? "quantize: valid, OK" : "quantize: valid, not OK");
    CHECK("quantize-status", rc == KVARN_OK || rc == KVARN_ERR_OVERFLOW, "valid call gave %d", rc);
    if (n_tiles == 0) {
        CHECK("quantize-status", rc == KVARN_OK, "no tiles gave %d", rc);
        return;
    }
    if (rc == KVARN_ERR_OVERFLOW && badp)
        CHECK("quantize-bad-tile", bad_after >= 0 && bad_after < n_tiles, "*bad_tile = %lld of %lld tiles",
              (long long)bad_after, (long long)n_tiles);
    if (rc == KVARN_OK) {
        for (int64_t t = 0; t < n_tiles; ++t) {
            RecordFacts r;
            record_facts(rec.p + t * L.total, f, r);
            CHECK("quantize-ok-finite", r.all_finite, "tile %lld: KVARN_OK but a non-finite fp16 field", (long long)t);
        }
    }
    // The values the quantiser sees, as float32 (after the input type's conversion).
    const size_t n_in = n_alloc * tile_elems;
    std::vector<float> kf(n_in), vf(n_in);
    bool finite = true;
    for (size_t i = 0; i < n_in; ++i) {
        if (elem == 2) {
            kf[i] = h2f(k.as<uint16_t>()[i]);
            vf[i] = h2f(v.as<uint16_t>()[i]);
        } else if (input_type == KVARN_INPUT_F32_AS_F16) {
            kf[i] = h2f(f2h(k.as<float>()[i]));
            vf[i] = h2f(f2h(v.as<float>()[i]));
        } else {
            kf[i] = k.as<float>()[i];
            vf[i] = v.as<float>()[i];
        }
        finite = finite && std::isfinite(kf[i]) && std::isfinite(vf[i]);
    }
    note(finite ? "quantize: finite input" : "quantize: non-finite input");
    if (!finite) return;  // "records of no meaning or KVARN_ERR_OVERFLOW": only the sanitizers
    auto compare = [&](const char* id, const char* what, int rc2, const std::vector<uint8_t>& rec2, int64_t bad2) {
        CHECK(id, rc2 == rc, "%s: status %d, here %d", what, rc2, rc);
        if (rc == KVARN_OK) {
            size_t i = 0;
            while (i < rec_bytes && rec2[i] == rec.p[i]) ++i;
            CHECK(id, i == rec_bytes, "%s: records differ at byte %zu (tile %zu, offset %zu; %02x here, %02x there)", what,
                  i, i / L.total, i % L.total, rec.p[i], rec2[i]);
        } else if (badp) {
            CHECK(id, bad2 == bad_after, "%s: bad tile %lld, here %lld", what, (long long)bad2, (long long)bad_after);
        }
    };
    // The same values in float32 (same ISA): "the records equal kvarn_quantize_tiles' on the same values".
    if (input_type == KVARN_INPUT_F16 || input_type == KVARN_INPUT_F32_AS_F16) {
        std::vector<uint8_t> rec2(rec_bytes);
        int64_t bad2 = -1;
        const int rc2 = kvarn_quantize_tiles(kf.data(), vf.data(), n_tiles, f.kbits, f.vbits, f.group, f.head_dim, iters,
                                             rec2.data(), threads, badp ? &bad2 : nullptr);
        note("quantize: typed input vs float32");
        compare("quantize-typed", "float32 input of the same values", rc2, rec2, bad2);
    }
    // The scalar ISA: the same records (SIMD quantisers reproduce the scalar bit for bit).
    if (g_isa != "scalar") {
        std::vector<uint8_t> rec2(rec_bytes);
        int64_t bad2 = -1;
        int rc2 = -1;
        under_scalar([&] { rc2 = call_quantize(a, rec2.data(), badp ? &bad2 : nullptr); });
        note("quantize: compared with scalar");
        compare("quantize-scalar", "the scalar ISA", rc2, rec2, bad2);
    }
}

// ---- kvarn_dequantize_tiles -----------------------------------------------------------------------
void fuzz_dequantize(Gen& g)
{
    g_op = "kvarn_dequantize_tiles";
    bool valid = true;
    const Fmt f = pick_tile_format(g, valid);
    const int G = kvarn_group_supported(f.group) ? f.group : 64;
    const int D = kvarn_head_dim_supported(f.head_dim) ? f.head_dim : 16;
    int64_t n_tiles = std::min<int64_t>(g.range<int64_t>(0, 3), std::max<int64_t>(1, (1 << 17) / ((int64_t)G * D)));
    size_t rec_off = g.range<size_t>(0, 3);  // read bytewise: any address
    size_t k_off = 0, v_off = 0;
    bool null_rec = false, null_k = false;
    switch (g.range<int>(0, 15)) {
        case 10: k_off = 2, valid = false; break;
        case 11: v_off = 1, valid = false; break;
        case 12: null_rec = true, valid = valid && n_tiles == 0; break;
        case 13: null_k = true, valid = valid && n_tiles == 0; break;
        case 14: n_tiles = -1, valid = false; break;
        case 15: n_tiles = INT64_MAX / 8, valid = false; break;
        default: break;
    }
    const size_t n_alloc = (n_tiles > 0 && n_tiles <= 3) ? (size_t)n_tiles : 0;
    const Fmt fa{kvarn_bits_supported(f.kbits) ? f.kbits : 4, kvarn_bits_supported(f.vbits) ? f.vbits : 2, G, D};
    const kvarn_record_layout L = kvarn_layout(fa.kbits, fa.vbits, G, D);
    Buf rec(n_alloc * L.total, rec_off);
    fill_records(g, rec.p, rec.n, fa, 1, 0, (int64_t)n_alloc, (int64_t)L.total);
    const size_t n_out = n_alloc * (size_t)G * D;
    Buf k(n_out * 4, k_off), v(n_out * 4, v_off);
    g.reseed();
    for (size_t i = 0; i < k.n; ++i) k.p[i] = (uint8_t)g.next();
    for (size_t i = 0; i < v.n; ++i) v.p[i] = (uint8_t)g.next();
    const auto kb = k.snapshot(), vb = v.snapshot();
    vlog("[%s] n %lld k%d v%d g%d D%d offs %zu/%zu/%zu valid %d\n", g_op, (long long)n_tiles, f.kbits, f.vbits, f.group,
         f.head_dim, rec_off, k_off, v_off, valid);
    const int rc = kvarn_dequantize_tiles(null_rec ? nullptr : rec.p, n_tiles, f.kbits, f.vbits, f.group, f.head_dim,
                                          null_k ? nullptr : k.as<float>(), v.as<float>());
    if (!valid) {
        note("dequantize: invalid arguments");
        CHECK("dequantize-arg", rc == KVARN_ERR_ARGUMENT, "invalid arguments gave %d", rc);
        CHECK("untouched", k.same(kb) && v.same(vb), "outputs written by a call returning %d", rc);
        return;
    }
    CHECK("dequantize-ok", rc == KVARN_OK, "valid call gave %d", rc);
    if (!n_alloc) return;
    for (size_t t = 0; t < n_alloc; ++t) {
        RecordFacts r;
        record_facts(rec.p + t * L.total, fa, r);
        if (!r.all_finite) continue;
        for (size_t i = t * G * D; i < (t + 1) * G * D; ++i)
            CHECK("dequantize-finite", std::isfinite(k.as<float>()[i]) && std::isfinite(v.as<float>()[i]),
                  "tile %zu: finite fields, non-finite output at %zu (k %g v %g)", t, i - t * G * D, k.as<float>()[i],
                  v.as<float>()[i]);
    }
    if (g_isa != "scalar") {
        std::vector<float> k2(n_out), v2(n_out);
        int rs = -1;
        under_scalar([&] { rs = kvarn_dequantize_tiles(rec.p, n_tiles, f.kbits, f.vbits, f.group, f.head_dim, k2.data(), v2.data()); });
        size_t w1 = 0, w2 = 0;
        note("dequantize: compared with scalar");
        CHECK("dequantize-scalar", rs == KVARN_OK && same_bits_nan(k2.data(), k.as<float>(), n_out, &w1) &&
                                       same_bits_nan(v2.data(), v.as<float>(), n_out, &w2),
              "differs from scalar (k at %zu: %a vs %a, v at %zu: %a vs %a)", w1, k.as<float>()[w1], k2[w1], w2,
              v.as<float>()[w2], v2[w2]);
    }
}

// ---- kvarn_attend ------------------------------------------------------------------------------
struct ViewBufs {
    Buf sink_k, sink_v, tail_k, tail_v, rec;
    Fmt f{};
};

// Elements a strided part spans: heads at hs, len rows at rs, D each.
size_t part_span(int64_t heads, int64_t hs, int64_t len, int64_t rs, int64_t row)
{
    return (size_t)((heads - 1) * hs + (len - 1) * rs + row);
}

int64_t pick_head_stride(Gen& g, int64_t len, int64_t rs, int64_t row, int64_t align)
{
    const int64_t packed = (len - 1) * rs + row;
    int64_t hs;
    switch (g.range<int>(0, 7)) {
        case 0: hs = 0; break;                                         // every head the same data
        case 1: hs = row; break;                                       // overlapping heads
        case 2: hs = g.range<int64_t>(0, 2 * packed); break;
        case 3: hs = packed + g.range<int64_t>(0, 64); break;
        default: hs = len * rs; break;                                 // packed [H][len][rs]
    }
    return hs / align * align;
}

void fuzz_attend(Gen& g)
{
    g_op = "kvarn_attend";
    bool valid = true, ok = true;
    const int32_t batch = g.range<int32_t>(1, 3);
    const int32_t Hk = g.range<int32_t>(1, 4);
    const int32_t nqk = g.range<int32_t>(1, 6);
    int32_t Hq = Hk * nqk;
    int32_t D = pick_head_dim(g, 1024, false, &ok);
    const int64_t budget = 1 << 21;  // multiply-adds per call, roughly: keeps an exec fast
    const int64_t max_tokens = std::max<int64_t>(16, budget / ((int64_t)batch * Hq * D));
    std::vector<kvarn_cache_view> views(batch);
    std::vector<ViewBufs> bufs(batch);
    for (int b = 0; b < batch; ++b) {
        kvarn_cache_view& c = views[b];
        std::memset(&c, 0, sizeof(c));
        c.num_kv_heads = Hk;
        c.head_dim = D;
        ViewBufs& vb = bufs[b];
        const int lens = g.range<int>(0, 7);  // which parts are present (bit 0 sink, 1 tiles, 2 tail)
        int64_t sink = (lens & 1) ? (g.flag() ? g.range<int64_t>(1, 16) : g.range<int64_t>(1, 300)) : 0;
        int64_t tail = (lens & 4) ? (g.flag() ? g.range<int64_t>(1, 16) : g.range<int64_t>(1, 200)) : 0;
        Fmt f{pick_bits(g, false, &ok), pick_bits(g, false, &ok), pick_group(g, false, &ok), D};
        int64_t tiles = (lens & 2) ? g.range<int64_t>(1, 3) : 0;
        if (!lens) sink = 1;
        while (sink + tail + tiles * f.group > max_tokens && (sink > 1 || tail > 1 || tiles > 1)) {
            sink /= 2, tail /= 2;
            if (tiles > 1) --tiles;
        }
        if (sink + tail + tiles == 0) sink = 1;
        vb.f = f;
        // Garbage in the fields of absent parts: "a part of length 0 is not read".
        c.kbits = tiles ? f.kbits : g.range<int32_t>(-3, 9);
        c.vbits = tiles ? f.vbits : g.range<int32_t>(-3, 9);
        c.group = tiles ? f.group : g.range<int32_t>(-1, 200);
        auto dense = [&](int64_t len, const uint16_t*& kp, const uint16_t*& vp, int64_t& hs, int64_t& rs, Buf& kb,
                         Buf& vbuf) {
            if (!len) {
                hs = g.rarely() ? -5 : 0;
                rs = g.rarely() ? -1 : 0;
                kp = vp = nullptr;
                return;
            }
            rs = D + (int64_t)g.range<int>(0, 3) * (g.flag() ? 1 : 16);
            hs = pick_head_stride(g, len, rs, D, 1);
            const size_t span = part_span(Hk, hs, len, rs, D);
            const size_t off = g.flag() ? 2 : 0;  // 2-byte aligned only: allowed
            kb.alloc(span * 2, off);
            fill_f16(g, kb.as<uint16_t>(), span);
            kp = kb.as<uint16_t>();
            if (g.rarely()) {
                vp = kp;  // K and V the same memory: inputs may alias
            } else {
                vbuf.alloc(span * 2, off);
                fill_f16(g, vbuf.as<uint16_t>(), span);
                vp = vbuf.as<uint16_t>();
            }
        };
        c.sink_len = sink;
        dense(sink, c.sink_k, c.sink_v, c.sink_head_stride, c.sink_row_stride, vb.sink_k, vb.sink_v);
        c.tail_len = tail;
        dense(tail, c.tail_k, c.tail_v, c.tail_head_stride, c.tail_row_stride, vb.tail_k, vb.tail_v);
        c.num_tiles = tiles;
        if (tiles) {
            const int64_t rec = (int64_t)kvarn_layout(f.kbits, f.vbits, f.group, D).total;
            c.record_tile_stride = rec + 2 * g.range<int64_t>(0, 3) * (g.flag() ? 1 : 32);
            c.record_head_stride = pick_head_stride(g, tiles, c.record_tile_stride, rec, 2);
            const size_t span = part_span(Hk, c.record_head_stride, tiles, c.record_tile_stride, rec);
            vb.rec.alloc(span, g.flag() ? 2 : 0);
            fill_records(g, vb.rec.p, span, f, Hk, c.record_head_stride, tiles, c.record_tile_stride);
            c.records = vb.rec.p;
        } else {
            c.records = g.rarely() ? reinterpret_cast<const uint8_t*>(uintptr_t(1)) : nullptr;  // not read
            c.record_tile_stride = g.rarely() ? -3 : 0;
            c.record_head_stride = g.rarely() ? 7 : 0;
        }
    }
    float scale = 1.0f / std::sqrt((float)D);
    switch (g.range<int>(0, 7)) {
        case 6: scale = special_f(g, false); break;
        case 7: scale = std::ldexp(1.0f, g.range<int>(-30, 30)) * (g.flag() ? -1.0f : 1.0f); break;
        default: break;
    }
    if (!std::isfinite(scale)) valid = false;
    bool thr_ok = true;
    const int32_t threads = pick_threads(g, true, &thr_ok);
    valid = valid && thr_ok;
    // One corruption the header calls invalid (or none).
    bool null_caches = false, null_q = false, null_out = false;
    size_t q_off = 0, out_off = 0;
    int32_t batch_arg = batch;
    const int corrupt = g.range<int>(0, 63);
    kvarn_cache_view& cv = views[g.range<int32_t>(0, batch - 1)];
    switch (corrupt) {
        case 40: null_caches = true, valid = false; break;
        case 41: null_q = true, valid = false; break;
        case 42: null_out = true, valid = false; break;
        case 43: batch_arg = g.flag() ? 0 : -1, valid = false; break;
        case 44: Hq = g.flag() ? 0 : (Hk > 1 ? Hq + 1 : -Hk), valid = false; break;
        case 45: q_off = 2, valid = false; break;
        case 46: out_off = 1, valid = false; break;
        case 47: if (batch > 1) cv.num_kv_heads = Hk + 1, valid = false; break;
        case 48: if (batch > 1) cv.head_dim = D + 16, valid = false; break;
        case 49: (g.flag() ? cv.sink_len : cv.tail_len) = -1, valid = false; break;
        case 50: cv.num_tiles = -1, valid = false; break;
        case 51: if (cv.sink_len) cv.sink_k = nullptr, valid = false; break;
        case 52: if (cv.sink_len) cv.sink_row_stride = D - 1, valid = false; break;
        case 53: if (cv.tail_len) cv.tail_head_stride = -1, valid = false; break;
        case 54:  // a tile stride below the record size
            if (cv.num_tiles) {
                cv.record_tile_stride = (int64_t)kvarn_layout(cv.kbits, cv.vbits, cv.group, cv.head_dim).total - 2;
                valid = false;
            }
            break;
        case 55: if (cv.num_tiles) cv.record_tile_stride += 1, valid = false; break;
        case 56: if (cv.num_tiles) cv.record_head_stride += 1, valid = false; break;
        case 57: if (cv.num_tiles) cv.records += 1, valid = false; break;
        case 58: if (cv.num_tiles) cv.kbits = 3, valid = false; break;
        case 59: if (cv.num_tiles) cv.group = 32, valid = false; break;
        case 60: cv.sink_len = cv.tail_len = cv.num_tiles = 0, valid = false; break;
        case 61:
            if (cv.sink_len && Hk > 1) cv.sink_head_stride = INT64_MAX / 2, valid = false;
            else if (cv.tail_len > 1) cv.tail_row_stride = INT64_MAX / 2, valid = false;
            break;
        case 62: if (cv.tail_len) cv.tail_v = reinterpret_cast<const uint16_t*>(reinterpret_cast<uintptr_t>(cv.tail_v) + 1), valid = false; break;
        case 63:  // a tile stride beyond PTRDIFF_MAX bytes: refused for 2+ tiles; one tile never steps by it
            if (cv.num_tiles) {
                cv.record_tile_stride = INT64_MAX - 1;
                if (cv.num_tiles > 1) valid = false;
            }
            break;
        default: break;
    }
    const size_t qn = (size_t)batch * (size_t)(Hq > 0 ? Hq : 1) * (size_t)D;
    Buf q(qn * 4, q_off), out(qn * 4, out_off);
    fill_f32(g, q.as<float>(), qn);
    g.reseed();
    for (size_t i = 0; i < out.n; ++i) out.p[i] = (uint8_t)g.next();
    const auto out_before = out.snapshot();
    vlog("[%s] batch %d Hk %d Hq %d D %d scale %g threads %d corrupt %d valid %d\n", g_op, batch_arg, Hk, Hq, D, scale,
         threads, corrupt, valid);
    for (int b = 0; b < batch; ++b) {
        const kvarn_cache_view& c = views[b];
        vlog("  view %d: k%d v%d g%d sink %lld (hs %lld rs %lld) tiles %lld (ts %lld hs %lld) tail %lld (hs %lld rs %lld)\n",
             b, c.kbits, c.vbits, c.group, (long long)c.sink_len, (long long)c.sink_head_stride,
             (long long)c.sink_row_stride, (long long)c.num_tiles, (long long)c.record_tile_stride,
             (long long)c.record_head_stride, (long long)c.tail_len, (long long)c.tail_head_stride,
             (long long)c.tail_row_stride);
    }
    auto call = [&](float* o) {
        return kvarn_attend(null_caches ? nullptr : views.data(), batch_arg, null_q ? nullptr : q.as<float>(), Hq, scale,
                            null_out ? nullptr : o, threads);
    };
    const int rc = call(out.as<float>());
    vlog("  -> %s status %d\n", g_op, rc);
    if (!valid) {
        note("attend: invalid arguments");
        CHECK("attend-arg", rc == KVARN_ERR_ARGUMENT, "invalid arguments (corruption %d) gave %d", corrupt, rc);
        CHECK("untouched", out.same(out_before), "out written by a call returning %d", rc);
        return;
    }
    CHECK("attend-status", rc == KVARN_OK || rc == KVARN_ERR_OVERFLOW, "valid call (corruption %d) gave %d", corrupt, rc);
    note(rc == KVARN_OK ? "attend: valid, OK" : "attend: valid, OVERFLOW");
    const float* o = out.as<float>();
    size_t bad_i = qn;
    for (size_t i = 0; i < qn && bad_i == qn; ++i)
        if (!std::isfinite(o[i])) bad_i = i;
    if (rc == KVARN_OK)
        CHECK("attend-ok-finite", bad_i == qn, "KVARN_OK but out[%zu] = %g (seq %zu, head %zu, d %zu)", bad_i, o[bad_i],
              bad_i / ((size_t)Hq * D), bad_i / D % Hq, bad_i % D);
    if (rc == KVARN_ERR_OVERFLOW) CHECK("attend-overflow-nonfinite", bad_i != qn, "KVARN_ERR_OVERFLOW but every output finite");
    // The header's promises about record fields.
    const int mode = kvarn_score_mode();
    for (int b = 0; b < batch; ++b) {
        const kvarn_cache_view& c = views[b];
        for (int64_t h = 0; h < c.num_kv_heads; ++h)
            for (int64_t t = 0; t < c.num_tiles; ++t) {
                RecordFacts r;
                record_facts(c.records + h * c.record_head_stride + t * c.record_tile_stride, bufs[b].f, r);
                if (r.nan) note("attend: NaN record field");
                if (r.inf_ka && c.kbits == 4 && mode != 0) note("attend: Inf ka, k4, int mode");
                if (r.neg_va && c.vbits == 2 && mode != 0) note("attend: negative va, v2, int mode");
                CHECK("attend-nan-record", !r.nan || rc == KVARN_ERR_OVERFLOW,
                      "seq %d kv head %lld tile %lld: a NaN field, status %d", b, (long long)h, (long long)t, rc);
                if (mode != 0) {
                    CHECK("attend-int-inf-ka", !(r.inf_ka && c.kbits == 4) || rc == KVARN_ERR_OVERFLOW,
                          "seq %d kv head %lld tile %lld: Inf in ka (4-bit keys, int mode %d), status %d", b, (long long)h,
                          (long long)t, mode, rc);
                    CHECK("attend-int-neg-va", !(r.neg_va && c.vbits == 2) || rc == KVARN_ERR_OVERFLOW,
                          "seq %d kv head %lld tile %lld: negative va (2-bit values, int mode %d), status %d", b,
                          (long long)h, (long long)t, mode, rc);
                }
            }
    }
    // Deterministic: the same call again gives the same bits.
    if (g.flag()) {
        Buf out2(qn * 4, 0);
        const int rc2 = call(out2.as<float>());
        size_t where = 0;
        note("attend: repeated");
        CHECK("attend-deterministic", rc2 == rc && same_bits_nan(o, out2.as<float>(), qn, &where),
              "second call: status %d vs %d, out[%zu] %a vs %a", rc2, rc, where, out2.as<float>()[where], o[where]);
    }
}

// ---- quantise, then attend: a cache of moderate finite data -----------------------------------------
void fuzz_chain(Gen& g)
{
    g_op = "kvarn_attend(quantised cache)";
    bool ok = true;
    const int32_t Hk = g.range<int32_t>(1, 2), nqk = g.range<int32_t>(1, 5), Hq = Hk * nqk;
    const int32_t D = pick_head_dim(g, 256, false, &ok);
    const Fmt f{pick_bits(g, false, &ok), pick_bits(g, false, &ok), pick_group(g, false, &ok), D};
    const int64_t T = g.range<int64_t>(1, 3), sink = g.flag() ? g.range<int64_t>(0, 130) : 0,
                  tail = g.flag() ? g.range<int64_t>(0, 130) : 0;
    const int G = f.group;
    const size_t tile_elems = (size_t)G * D;
    const size_t n_tiles = (size_t)Hk * T;  // record h * T + t
    std::vector<float> k(n_tiles * tile_elems), v(n_tiles * tile_elems);
    fill_f32(g, k.data(), k.size(), true, 256.0f);
    fill_f32(g, v.data(), v.size(), true, 256.0f);
    const kvarn_record_layout L = kvarn_layout(f.kbits, f.vbits, G, D);
    std::vector<uint8_t> recs(n_tiles * L.total);
    const int32_t iters = g.range<int32_t>(0, 10);
    int64_t bad = -1;
    bool thr_ok = true;
    const int32_t threads = pick_threads(g, false, &thr_ok);
    const int qrc = kvarn_quantize_tiles(k.data(), v.data(), (int64_t)n_tiles, f.kbits, f.vbits, G, D, iters, recs.data(),
                                         threads, &bad);
    vlog("[%s] Hk %d Hq %d k%d v%d g%d D%d T %lld sink %lld tail %lld iters %d threads %d: quantise %d\n", g_op, Hk, Hq,
         f.kbits, f.vbits, G, D, (long long)T, (long long)sink, (long long)tail, iters, threads, qrc);
    CHECK("chain-quantize", qrc == KVARN_OK, "|x| <= 256 gave %d (bad tile %lld)", qrc, (long long)bad);
    // The cache view: records copied to a strided buffer; sink / tail fp16 in [H][len][D + pad].
    kvarn_cache_view c;
    std::memset(&c, 0, sizeof(c));
    c.num_kv_heads = Hk;
    c.head_dim = D;
    c.kbits = f.kbits, c.vbits = f.vbits, c.group = G;
    c.num_tiles = T;
    c.record_tile_stride = (int64_t)L.total + 2 * g.range<int64_t>(0, 8);
    c.record_head_stride = T * c.record_tile_stride + 2 * g.range<int64_t>(0, 8);
    Buf rb(part_span(Hk, c.record_head_stride, T, c.record_tile_stride, (int64_t)L.total), 2 * g.range<size_t>(0, 1));
    for (int h = 0; h < Hk; ++h)
        for (int64_t t = 0; t < T; ++t)
            std::memcpy(rb.p + h * c.record_head_stride + t * c.record_tile_stride, recs.data() + (h * T + t) * L.total, L.total);
    c.records = rb.p;
    Buf sk, sv, tk, tv;
    auto dense = [&](int64_t len, Buf& kb, Buf& vb, const uint16_t*& kp, const uint16_t*& vp, int64_t& hs, int64_t& rs) {
        if (!len) return;
        rs = D + g.range<int64_t>(0, 8);
        hs = len * rs;
        const size_t span = part_span(Hk, hs, len, rs, D);
        kb.alloc(span * 2, 0);
        vb.alloc(span * 2, 0);
        fill_f16(g, kb.as<uint16_t>(), span, true, 256.0f);
        fill_f16(g, vb.as<uint16_t>(), span, true, 256.0f);
        kp = kb.as<uint16_t>(), vp = vb.as<uint16_t>();
    };
    c.sink_len = sink;
    dense(sink, sk, sv, c.sink_k, c.sink_v, c.sink_head_stride, c.sink_row_stride);
    c.tail_len = tail;
    dense(tail, tk, tv, c.tail_k, c.tail_v, c.tail_head_stride, c.tail_row_stride);
    const size_t qn = (size_t)Hq * D;
    Buf q(qn * 4, 0), out(qn * 4, 0);
    fill_f32(g, q.as<float>(), qn, true, 1.0f);
    const float scale = std::ldexp(1.0f, g.range<int>(-12, 2)) * (g.flag() ? -1.0f : 1.0f);
    const int rc = kvarn_attend(&c, 1, q.as<float>(), Hq, scale, out.as<float>(), threads);
    vlog("  -> %s status %d\n", g_op, rc);
    note("chain: attended");
    CHECK("chain-attend", rc == KVARN_OK, "moderate cache and queries (|q scale| <= 4) gave %d", rc);
    // Reference: float64 softmax attention over the dequantised tiles (original frame) and the fp16 parts.
    std::vector<float> kd(n_tiles * tile_elems), vd(n_tiles * tile_elems);
    const int drc = kvarn_dequantize_tiles(recs.data(), (int64_t)n_tiles, f.kbits, f.vbits, G, D, kd.data(), vd.data());
    CHECK("chain-dequantize", drc == KVARN_OK, "dequantize gave %d", drc);
    // The reference check in float mode only (the integer modes' accuracy is tests/test_simd.py's):
    // allowed error tol * max|v| plus what a score error of kappa * ||q scale|| ||k|| can move the weights.
    const int mode = kvarn_score_mode();
    if (mode != 0) return;
    const double tol = 1e-3, kappa = 1e-5;
    const int64_t n_tok = sink + T * G + tail;
    std::vector<double> s(n_tok), ref(D);
    std::vector<const float*> kr(n_tok), vr(n_tok);
    std::vector<float> dense_k(n_tok * (size_t)D), dense_v(n_tok * (size_t)D);
    for (int h = 0; h < Hk; ++h) {
        // token rows of KV head h, as float
        int64_t t = 0;
        auto put = [&](const uint16_t* kp, const uint16_t* vp, int64_t len, int64_t hs, int64_t rs) {
            for (int64_t i = 0; i < len; ++i, ++t)
                for (int d = 0; d < D; ++d) {
                    dense_k[t * D + d] = h2f(kp[h * hs + i * rs + d]);
                    dense_v[t * D + d] = h2f(vp[h * hs + i * rs + d]);
                }
        };
        put(c.sink_k, c.sink_v, sink, c.sink_head_stride, c.sink_row_stride);
        for (int64_t tt = 0; tt < T; ++tt)
            for (int r = 0; r < G; ++r, ++t)
                for (int d = 0; d < D; ++d) {
                    dense_k[t * D + d] = kd[((h * T + tt) * G + r) * (size_t)D + d];
                    dense_v[t * D + d] = vd[((h * T + tt) * G + r) * (size_t)D + d];
                }
        put(c.tail_k, c.tail_v, tail, c.tail_head_stride, c.tail_row_stride);
        double vmax = 0;
        for (size_t i = 0; i < dense_v.size(); ++i) vmax = std::max(vmax, std::fabs((double)dense_v[i]));
        for (int j = 0; j < nqk; ++j) {
            const int qh = h * nqk + j;
            const float* qq = q.as<float>() + (size_t)qh * D;
            double m = -INFINITY, bound = 0, qnorm = 0;
            for (int d = 0; d < D; ++d) qnorm += (double)qq[d] * qq[d];
            qnorm = std::sqrt(qnorm) * std::fabs(scale);
            for (int64_t i = 0; i < n_tok; ++i) {
                double dot = 0, knorm = 0;
                for (int d = 0; d < D; ++d) {
                    dot += (double)qq[d] * dense_k[i * D + d];
                    knorm += (double)dense_k[i * D + d] * dense_k[i * D + d];
                }
                s[i] = dot * scale;
                m = std::max(m, s[i]);
                bound = std::max(bound, qnorm * std::sqrt(knorm));
            }
            double l = 0;
            std::fill(ref.begin(), ref.end(), 0.0);
            for (int64_t i = 0; i < n_tok; ++i) {
                const double p = std::exp(s[i] - m);
                l += p;
                for (int d = 0; d < D; ++d) ref[d] += p * dense_v[i * D + d];
            }
            double err = 0;
            for (int d = 0; d < D; ++d) err = std::max(err, std::fabs(ref[d] / l - out.as<float>()[(size_t)qh * D + d]));
            const double allowed = vmax * (tol + 2 * kappa * bound) + 1e-30;
            note("chain: reference compared (per head)");
            CHECK("chain-reference", err <= allowed,
                  "kv head %d query head %d: max |out - ref| = %g, max |v| = %g, score bound %g (allowed %g)", h, qh, err,
                  vmax, bound, allowed);
        }
    }
}

// ---- kvarn_balance ----------------------------------------------------------------------------------
void fuzz_balance(Gen& g)
{
    g_op = "kvarn_balance";
    bool valid = true;
    int32_t rows = g.range<int32_t>(2, 200), cols = g.range<int32_t>(2, 200);
    while ((int64_t)rows * cols > 16384) rows = std::max(2, rows / 2), cols = std::max(2, cols / 2);
    int32_t iters = g.range<int32_t>(0, 12);
    if (g.rarely() && rows * cols <= 1024) iters = g.range<int32_t>(13, KVARN_MAX_SINKHORN_ITERS);
    size_t x_off = 0, r_off = 0, c_off = 0;
    bool null_x = false, null_r = false;
    int32_t rows_arg = rows, cols_arg = cols;
    switch (g.range<int>(0, 15)) {
        case 8: rows_arg = g.range<int32_t>(-2, 1), valid = false; break;
        case 9: cols_arg = g.flag() ? 1 : INT32_MIN, valid = false; break;
        case 10: iters = g.flag() ? -1 : KVARN_MAX_SINKHORN_ITERS + 1, valid = false; break;
        case 11: x_off = 2, valid = false; break;
        case 12: (g.flag() ? r_off : c_off) = 1, valid = false; break;
        case 13: null_x = true, valid = false; break;
        case 14: null_r = true, valid = false; break;
        case 15: rows_arg = cols_arg = INT32_MAX, valid = false; break;  // beyond PTRDIFF_MAX bytes
        default: break;
    }
    Buf x((size_t)rows * cols * 4, x_off), r((size_t)rows * 4, r_off), c((size_t)cols * 4, c_off);
    const bool finite = g.flag();
    fill_f32(g, x.as<float>(), (size_t)rows * cols, finite);
    std::memset(r.p, 0xcd, r.n);
    std::memset(c.p, 0xcd, c.n);
    const auto rb = r.snapshot(), cb = c.snapshot();
    vlog("[%s] %d x %d iters %d valid %d finite %d\n", g_op, rows_arg, cols_arg, iters, valid, finite);
    const int rc = kvarn_balance(null_x ? nullptr : x.as<float>(), rows_arg, cols_arg, iters, null_r ? nullptr : r.as<float>(),
                                 c.as<float>());
    if (!valid) {
        note("balance: invalid arguments");
        CHECK("balance-arg", rc == KVARN_ERR_ARGUMENT, "invalid arguments gave %d", rc);
        CHECK("untouched", r.same(rb) && c.same(cb), "outputs written by a call returning %d", rc);
        return;
    }
    CHECK("balance-ok", rc == KVARN_OK, "valid call gave %d", rc);
    bool all_finite = true;
    for (size_t i = 0; i < (size_t)rows * cols; ++i) all_finite = all_finite && std::isfinite(x.as<float>()[i]);
    if (!all_finite) return;
    note("balance: finite, range checked");
    const float lo = std::exp(-0.3f) * (1 - 1e-5f), hi = std::exp(10.0f) * (1 + 1e-5f);
    for (int i = 0; i < rows; ++i)
        CHECK("balance-range", r.as<float>()[i] >= lo && r.as<float>()[i] <= hi, "r[%d] = %g", i, r.as<float>()[i]);
    for (int j = 0; j < cols; ++j)
        CHECK("balance-range", c.as<float>()[j] >= lo && c.as<float>()[j] <= hi, "c[%d] = %g", j, c.as<float>()[j]);
}

// ---- kvarn_scan_f32 / kvarn_scan_f16 ----------------------------------------------------------------
// Strides for shape n (elements); *lo / *hi: the smallest and largest element offset.
void pick_strides(Gen& g, const int64_t n[3], int64_t s[3], int64_t* lo, int64_t* hi)
{
    const int kind = g.range<int>(0, 5);
    int64_t contig[3] = {n[1] * n[2], n[2], 1};
    for (int a = 0; a < 3; ++a) {
        switch (kind) {
            case 0: s[a] = contig[a]; break;
            case 1: s[a] = -contig[a]; break;
            case 2: s[a] = contig[a] * g.range<int64_t>(1, 3) + (a == 2 ? 0 : g.range<int64_t>(0, 4)); break;
            case 3: s[a] = g.range<int64_t>(-40, 40); break;
            case 4: s[a] = a == 2 ? 1 : contig[a] + g.range<int64_t>(0, 3); break;  // rows contiguous, padded
            default: s[a] = g.flag() ? 0 : contig[a]; break;
        }
    }
    *lo = *hi = 0;
    for (int a = 0; a < 3; ++a) {
        const int64_t e = (n[a] - 1) * s[a];
        if (e < 0) *lo += e;
        else *hi += e;
    }
}

void fuzz_scan(Gen& g, bool f16)
{
    g_op = f16 ? "kvarn_scan_f16" : "kvarn_scan_f32";
    int64_t n[3];
    for (int a = 0; a < 3; ++a) n[a] = g.flag() ? g.range<int64_t>(0, 4) : g.range<int64_t>(1, 70);
    while (n[0] * n[1] * n[2] > 20000) n[0] = (n[0] + 1) / 2, n[1] = (n[1] + 1) / 2;
    const bool empty = !n[0] || !n[1] || !n[2];
    int64_t xs[3], os[3], xlo, xhi, olo, ohi;
    pick_strides(g, n, xs, &xlo, &xhi);
    pick_strides(g, n, os, &olo, &ohi);
    const size_t elem = f16 ? 2 : 4;
    const size_t xspan = empty ? 0 : (size_t)(xhi - xlo + 1), ospan = empty ? 0 : (size_t)(ohi - olo + 1);
    bool valid = true;
    size_t x_off = 0, o_off = 0;
    bool null_x = false, null_shape = false, null_xs = false, null_max = false, null_out = g.rarely(), null_os = false;
    int64_t shape_arg[3] = {n[0], n[1], n[2]};
    float limit = 65504.0f;
    switch (g.range<int>(0, 7)) {
        case 0: limit = g.range<int>(0, 65504); break;
        case 1: limit = special_f(g, false); break;
        case 2: limit = std::ldexp(1.0f, g.range<int>(-20, 15)); break;
        default: break;
    }
    if (!f16 && !(limit >= 0.0f && limit <= 65504.0f)) valid = false;
    switch (g.range<int>(0, 31)) {
        case 20: x_off = elem == 2 ? 1 : 2, valid = valid && empty; break;  // misaligned: refused only with elements
        case 21: o_off = 1, valid = valid && (empty || null_out); break;
        case 22: null_x = true, valid = valid && empty; break;
        case 23: null_shape = true, valid = false; break;
        case 24: null_xs = true, valid = false; break;
        case 25: null_max = true, valid = false; break;
        case 26: null_os = true, valid = valid && null_out; break;
        case 27: shape_arg[g.range<int>(0, 2)] = -g.range<int64_t>(1, 3), valid = false; break;
        default: break;
    }
    Buf x(xspan * elem, x_off), out(ospan * 2, o_off);
    if (f16) fill_f16(g, x.as<uint16_t>(), xspan);
    else fill_f32(g, x.as<float>(), xspan);
    g.reseed();
    for (size_t i = 0; i < out.n; ++i) out.p[i] = (uint8_t)g.next();
    const auto out_before = out.snapshot();
    const void* xbase = x.p + (size_t)(-xlo) * elem;  // element offset 0
    uint16_t* obase = out.as<uint16_t>() + (-olo);
    float max_abs = -7.0f;
    vlog("[%s] shape %lld %lld %lld x strides %lld %lld %lld out strides %lld %lld %lld limit %g valid %d\n", g_op,
         (long long)shape_arg[0], (long long)shape_arg[1], (long long)shape_arg[2], (long long)xs[0], (long long)xs[1],
         (long long)xs[2], (long long)os[0], (long long)os[1], (long long)os[2], limit, valid);
    const int rc = f16 ? kvarn_scan_f16(null_x ? nullptr : static_cast<const uint16_t*>(xbase), null_shape ? nullptr : shape_arg,
                                        null_xs ? nullptr : xs, null_max ? nullptr : &max_abs, null_out ? nullptr : obase,
                                        null_os ? nullptr : os)
                       : kvarn_scan_f32(null_x ? nullptr : static_cast<const float*>(xbase), null_shape ? nullptr : shape_arg,
                                        null_xs ? nullptr : xs, null_max ? nullptr : &max_abs, null_out ? nullptr : obase,
                                        null_os ? nullptr : os, limit);
    if (!valid) {
        note(f16 ? "scan_f16: invalid arguments" : "scan_f32: invalid arguments");
        CHECK("scan-arg", rc == KVARN_ERR_ARGUMENT, "invalid arguments gave %d", rc);
        CHECK("untouched", out.same(out_before), "out written by a call returning %d", rc);
        return;
    }
    CHECK("scan-ok", rc == KVARN_OK, "valid call gave %d", rc);
    // Reference: max |x| (NaN if any NaN, else Inf if any Inf), and the copy (in i, j, t order).
    bool any_nan = false;
    float ref = 0.0f;
    std::vector<uint8_t> want = out_before;
    auto at = [&](int64_t i, int64_t j, int64_t t) -> float {
        const int64_t e = i * xs[0] + j * xs[1] + t * xs[2];
        if (f16) return h2f(static_cast<const uint16_t*>(xbase)[e]);
        return static_cast<const float*>(xbase)[e];
    };
    for (int64_t i = 0; i < n[0]; ++i)
        for (int64_t j = 0; j < n[1]; ++j)
            for (int64_t t = 0; t < n[2]; ++t) {
                const float v = at(i, j, t);
                if (std::isnan(v)) any_nan = true;
                else ref = std::max(ref, std::fabs(v));
            }
    if (any_nan) CHECK("scan-max", std::isnan(max_abs), "max_abs %g, x holds a NaN", max_abs);
    else CHECK("scan-max", max_abs == ref, "max_abs %a, reference %a", max_abs, ref);
    const bool write = !null_out && !empty && (f16 ? (!any_nan && std::isfinite(ref)) : (!any_nan && ref <= limit));
    if (write)
        for (int64_t i = 0; i < n[0]; ++i)
            for (int64_t j = 0; j < n[1]; ++j)
                for (int64_t t = 0; t < n[2]; ++t) {
                    const int64_t e = i * os[0] + j * os[1] + t * os[2] - olo;
                    uint16_t h;
                    if (f16) h = static_cast<const uint16_t*>(xbase)[i * xs[0] + j * xs[1] + t * xs[2]];
                    else h = f2h(at(i, j, t));
                    std::memcpy(want.data() + 2 * e, &h, 2);
                }
    note(write ? (f16 ? "scan_f16: copy written" : "scan_f32: copy written")
               : (f16 ? "scan_f16: copy not written" : "scan_f32: copy not written"));
    size_t diff = 0;
    while (diff < want.size() && want[diff] == out.p[diff]) ++diff;
    CHECK("scan-out", diff == want.size(), "out %s; first difference at byte %zu (of %zu)",
          write ? "should be the fp16 copy" : "should be untouched", diff, want.size());
}

// ---- settings and the rest ---------------------------------------------------------------------------
void fuzz_misc(Gen& g)
{
    g_op = "settings";
    const char* names[] = {"scalar", "avx2", "avx512", "", "AVX2", "avx512 ", "none", "bogus", nullptr, "avx"};
    const int which = g.range<int>(0, 9);
    const char* name = names[which];
    const std::string before = kvarn_active_isa();
    const int rc = kvarn_set_isa(name);
    const bool avail = kvarn_isa_available(name) != 0;
    CHECK("settings", (rc == KVARN_OK) == avail, "kvarn_set_isa(%s) = %d, available %d", name ? name : "(null)", rc, avail);
    if (rc != KVARN_OK) {
        CHECK("settings", before == kvarn_active_isa(), "failed kvarn_set_isa changed the ISA to %s", kvarn_active_isa());
        const char* e = kvarn_isa_error();
        CHECK("settings", e && *e, "kvarn_isa_error empty after a failed kvarn_set_isa");
    } else {
        CHECK("settings", !std::strcmp(kvarn_active_isa(), name), "active %s", kvarn_active_isa());
        const char* e = kvarn_isa_error();
        CHECK("settings", e && !*e, "kvarn_isa_error '%s' after a successful kvarn_set_isa", e ? e : "(null)");
    }
    const int mode_before = kvarn_score_mode();
    const int32_t bad_modes[] = {-1, 3, INT32_MIN, INT32_MAX, 100};
    const int32_t m = bad_modes[g.range<int>(0, 4)];
    CHECK("settings", kvarn_set_score_mode(m) == KVARN_ERR_ARGUMENT, "kvarn_set_score_mode(%d) accepted", m);
    CHECK("settings", kvarn_score_mode() == mode_before, "a refused score mode changed the mode");
    CHECK("settings", kvarn_default_threads() >= 1, "kvarn_default_threads %d", kvarn_default_threads());
    // The pool's fault hook (part of the ABI): every item runs, the thrown one is reported.
    if (g.flag()) {
        g_op = "kvarn_testing_pool_fault";
        const int64_t items = g.range<int64_t>(-1, 4);
        bool thr_ok = true;
        const int32_t threads = pick_threads(g, true, &thr_ok);
        const int32_t helper = g.range<int32_t>(0, 1);
        int64_t finished = -5;
        int32_t faulted = -5;
        const int prc = kvarn_testing_pool_fault(items, threads, helper, &finished, &faulted);
        if (items <= 0 || !thr_ok) {
            CHECK("pool-fault", prc == KVARN_ERR_ARGUMENT && finished == -5 && faulted == -5, "invalid arguments gave %d", prc);
        } else {
            CHECK("pool-fault", (faulted == 1 && prc == KVARN_ERR_INTERNAL && finished == items - 1) ||
                                    (faulted == 0 && prc == KVARN_OK && finished == items),
                  "items %lld threads %d helper %d: status %d, faulted %d, finished %lld", (long long)items, threads, helper,
                  prc, faulted, (long long)finished);
        }
    }
    set_isa_or_die(g_isa.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***)
{
    g_verbose = std::getenv("KVARN_FUZZ_VERBOSE") && *std::getenv("KVARN_FUZZ_VERBOSE") == '1';
    g_stats = std::getenv("KVARN_FUZZ_STATS") && *std::getenv("KVARN_FUZZ_STATS") == '1';
    if (g_stats) std::atexit(print_stats);
    const char* skip = std::getenv("KVARN_FUZZ_SKIP");
    g_skip = std::string(",") + (skip ? skip : "") + ",";
    const char* forced = std::getenv("KVARN_FUZZ_ISA");
    if (forced && *forced) {
        if (!kvarn_isa_available(forced)) {
            std::fprintf(stderr, "KVARN_FUZZ_ISA=%s: not available on this machine\n", forced);
            std::exit(2);
        }
        g_forced_isa = forced;
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    FuzzedDataProvider fdp(data, size);
    Gen g(fdp);
    g_op = "settings";
    configure(g);
    switch (fdp.ConsumeIntegralInRange<int>(0, 11)) {
        case 0: fuzz_hadamard(g, false); break;
        case 1: fuzz_hadamard(g, true); break;
        case 2:
        case 3: fuzz_quantize(g); break;
        case 4: fuzz_dequantize(g); break;
        case 5:
        case 6: fuzz_attend(g); break;
        case 7: fuzz_chain(g); break;
        case 8: fuzz_balance(g); break;
        case 9: fuzz_scan(g, false); break;
        case 10: fuzz_scan(g, true); break;
        case 11: fuzz_misc(g); break;
    }
    return 0;
}
