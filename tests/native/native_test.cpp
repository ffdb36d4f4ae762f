// Native driver of the C ABI, for running under AddressSanitizer/UBSan:
//   cmake -S . -B build-asan -DKVARN_SANITIZE=ON && cmake --build build-asan -j2 &&
//   for isa in scalar avx2 avx512; do KVARN_ISA=$isa build-asan/native/cpu/kvarn_native_test; done
// Exercises every kernel at sizes that break vector tails, and the argument checks.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvarn/kernels.h"  // float_to_half / half_to_float
#include "kvarn/kvarn.h"

static int failures = 0;

// Allocation failure on demand: every global operator new of this program throws while armed.
static std::atomic<bool> g_fail_alloc{false};
void* operator new(std::size_t n)
{
    if (g_fail_alloc.load()) throw std::bad_alloc();
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            std::fprintf(stderr, "%s:%d: CHECK(%s)\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                   \
        }                                                                 \
    } while (0)

static uint16_t to_half(float f)
{
    // Test inputs are small normal numbers: truncating conversion is enough here.
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    if (exp <= 0) return (uint16_t)sign;  // flush tiny values to zero
    return (uint16_t)(sign | ((uint32_t)exp << 10) | ((x >> 13) & 0x3ff));
}

// A view of quantised tiles alone (no sink, no tail): records [tile][head] at the given strides.
static kvarn_cache_view tiles_view(const uint8_t* records, int64_t num_tiles, int num_kv_heads, int head_dim, int group,
                                   int kbits, int vbits, int64_t tile_stride, int64_t head_stride)
{
    kvarn_cache_view c{};
    c.num_kv_heads = num_kv_heads;
    c.head_dim = head_dim;
    c.group = group;
    c.kbits = kbits;
    c.vbits = vbits;
    c.records = records;
    c.num_tiles = num_tiles;
    c.record_tile_stride = tile_stride;
    c.record_head_stride = head_stride;
    return c;
}

// k4v2 tiles quantised from random tokens ([tile][head] records) and an fp16 tail of random tokens, as one view of
// Hk heads. The view points into the struct's own vectors: use it while the struct lives, and do not copy the struct.
struct TiledTail {
    std::vector<float> k, v;  // the tiles' input tokens
    std::vector<uint8_t> records;
    std::vector<uint16_t> tail_k, tail_v;
    kvarn_cache_view view{};
};

static void make_tiled_tail(TiledTail& t, std::mt19937& gen, int G, int D, int Hk, int tiles, int tail)
{
    std::normal_distribution<float> normal(0.f, 1.f);
    const size_t rec = kvarn_layout(4, 2, G, D).total;
    t.k.resize((size_t)tiles * Hk * G * D);
    t.v.resize(t.k.size());
    for (auto& x : t.k) x = normal(gen);
    for (auto& x : t.v) x = normal(gen);
    t.records.resize((size_t)tiles * Hk * rec);
    CHECK(kvarn_quantize_tiles(t.k.data(), t.v.data(), tiles * Hk, 4, 2, G, D, 8, t.records.data(), 1, nullptr) ==
          KVARN_OK);
    t.tail_k.resize((size_t)Hk * tail * D);
    t.tail_v.resize(t.tail_k.size());
    for (auto& x : t.tail_k) x = to_half(normal(gen));
    for (auto& x : t.tail_v) x = to_half(normal(gen));
    t.view = tiles_view(t.records.data(), tiles, Hk, D, G, 4, 2, (int64_t)(Hk * rec), (int64_t)rec);
    t.view.tail_k = t.tail_k.data();
    t.view.tail_v = t.tail_v.data();
    t.view.tail_len = tail;
    t.view.tail_head_stride = (int64_t)tail * D;
    t.view.tail_row_stride = D;
}

// kvarn_scan_f32: max |x| with NaN / Inf, and the fp16 copy written only within the limit, over
// strided and reversed views (exact-size buffers, so that ASan sees any access outside them).
void scan_checks()
{
    const int64_t n0 = 2, n1 = 3, n2 = 5;
    std::vector<float> x(n0 * n1 * n2);
    for (size_t i = 0; i < x.size(); ++i) x[i] = ((int)i - 11) * 0.37f;
    x[7] = 65504.0f;  // the largest half: within the limit
    const int64_t shape[3] = {n0, n1, n2};
    const int64_t forward[3] = {n1 * n2, n2, 1};
    const int64_t reversed[3] = {-n1 * n2, -n2, -1};  // from the last element
    for (int dir = 0; dir < 2; ++dir) {
        const float* base = dir ? x.data() + x.size() - 1 : x.data();
        std::vector<uint16_t> out(x.size(), 0xabcd);
        uint16_t* obase = dir ? out.data() + out.size() - 1 : out.data();
        float m = -1.0f;
        CHECK(kvarn_scan_f32(base, shape, dir ? reversed : forward, &m, obase, dir ? reversed : forward, 65504.0f) ==
              KVARN_OK);
        CHECK(m == 65504.0f);
        for (size_t i = 0; i < x.size(); ++i) CHECK(out[i] == kvarn::float_to_half(x[i]));
        std::vector<uint16_t> kept(x.size(), 0xabcd);
        CHECK(kvarn_scan_f32(base, shape, dir ? reversed : forward, &m, kept.data(), forward, 100.0f) == KVARN_OK);
        CHECK(m == 65504.0f && kept == std::vector<uint16_t>(x.size(), 0xabcd));  // beyond the limit: not written
    }
    // Every other element of each row (x's stride 2 in the last axis), written contiguously.
    const int64_t half_shape[3] = {n0, n1, 2}, every_other[3] = {n1 * n2, n2, 2}, dense[3] = {n1 * 2, 2, 1};
    std::vector<uint16_t> sub(n0 * n1 * 2, 0);
    float m = 0.0f;
    CHECK(kvarn_scan_f32(x.data(), half_shape, every_other, &m, sub.data(), dense, 65504.0f) == KVARN_OK);
    CHECK(sub[3] == kvarn::float_to_half(x[n2 + 2]));
    std::vector<float> bad = x;
    bad[13] = INFINITY;
    CHECK(kvarn_scan_f32(bad.data(), shape, forward, &m, nullptr, nullptr, 65504.0f) == KVARN_OK && std::isinf(m));
    bad[4] = NAN;
    std::vector<uint16_t> out(x.size(), 0xabcd);
    CHECK(kvarn_scan_f32(bad.data(), shape, forward, &m, out.data(), forward, 65504.0f) == KVARN_OK && std::isnan(m));
    CHECK(out == std::vector<uint16_t>(x.size(), 0xabcd));
    // Empty: max 0, nothing read or written, NULL pointers allowed.
    const int64_t empty[3] = {2, 0, 5};
    CHECK(kvarn_scan_f32(nullptr, empty, forward, &m, nullptr, forward, 65504.0f) == KVARN_OK && m == 0.0f);
    // Refused: negative size, no max_abs, a limit outside [0, 65504], out without strides, misalignment.
    const int64_t negative[3] = {2, -1, 5};
    CHECK(kvarn_scan_f32(x.data(), negative, forward, &m, nullptr, nullptr, 1.0f) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_scan_f32(x.data(), shape, forward, nullptr, nullptr, nullptr, 1.0f) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_scan_f32(x.data(), shape, forward, &m, nullptr, nullptr, 65505.0f) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_scan_f32(x.data(), shape, forward, &m, nullptr, nullptr, NAN) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_scan_f32(x.data(), shape, forward, &m, out.data(), nullptr, 1.0f) == KVARN_ERR_ARGUMENT);
    const float* odd = reinterpret_cast<const float*>(reinterpret_cast<const char*>(x.data()) + 1);
    CHECK(kvarn_scan_f32(odd, empty, forward, &m, nullptr, nullptr, 1.0f) == KVARN_OK);  // empty: not read
    const int64_t one[3] = {1, 1, 1};
    CHECK(kvarn_scan_f32(odd, one, forward, &m, nullptr, nullptr, 1.0f) == KVARN_ERR_ARGUMENT);
}

// kvarn_scan_f16: max |x| of binary16 patterns (NaN / Inf), the copy written only when finite; forward,
// reversed, strided (the element-wise copy) and row-contiguous (the row copy) views.
void scan_f16_checks()
{
    const int64_t n0 = 2, n1 = 3, n2 = 5;
    std::vector<uint16_t> x(n0 * n1 * n2);
    for (size_t i = 0; i < x.size(); ++i) x[i] = kvarn::float_to_half(((int)i - 11) * 0.37f);
    x[7] = 0xfbff;  // -65504: the largest magnitude, negative
    x[8] = 0x8000;  // -0
    const int64_t shape[3] = {n0, n1, n2};
    const int64_t forward[3] = {n1 * n2, n2, 1};
    const int64_t reversed[3] = {-n1 * n2, -n2, -1};
    for (int dir = 0; dir < 2; ++dir) {
        const uint16_t* base = dir ? x.data() + x.size() - 1 : x.data();
        std::vector<uint16_t> out(x.size(), 0xabcd);
        uint16_t* obase = dir ? out.data() + out.size() - 1 : out.data();
        float m = -1.0f;
        CHECK(kvarn_scan_f16(base, shape, dir ? reversed : forward, &m, obase, dir ? reversed : forward) == KVARN_OK);
        CHECK(m == 65504.0f && out == x);
        // Read forward, written reversed: the element-wise copy.
        std::vector<uint16_t> flipped(x.size(), 0xabcd);
        CHECK(kvarn_scan_f16(x.data(), shape, forward, &m, flipped.data() + flipped.size() - 1, reversed) == KVARN_OK);
        for (size_t i = 0; i < x.size(); ++i) CHECK(flipped[x.size() - 1 - i] == x[i]);
    }
    // Every other element of each row, written contiguously; and rows into a wider buffer (a cache's slots).
    const int64_t half_shape[3] = {n0, n1, 2}, every_other[3] = {n1 * n2, n2, 2}, dense[3] = {n1 * 2, 2, 1};
    std::vector<uint16_t> sub(n0 * n1 * 2, 0);
    float m = 0.0f;
    CHECK(kvarn_scan_f16(x.data(), half_shape, every_other, &m, sub.data(), dense) == KVARN_OK);
    CHECK(sub[3] == x[n2 + 2] && m == 65504.0f);
    const int64_t wide[3] = {4 * n1 * n2, n2, 1};  // out: [n0][4 n1][n2], written at rows 0..n1-1
    std::vector<uint16_t> big(n0 * 4 * n1 * n2, 0x1234);
    CHECK(kvarn_scan_f16(x.data(), shape, forward, &m, big.data(), wide) == KVARN_OK);
    CHECK(big[4 * n1 * n2 + n2 + 1] == x[n1 * n2 + n2 + 1] && big[n1 * n2] == 0x1234);
    // NaN beside Inf: NaN; Inf alone: Inf; out untouched either way.
    std::vector<uint16_t> bad = x;
    bad[13] = 0xfc00;  // -Inf
    std::vector<uint16_t> out(x.size(), 0xabcd);
    CHECK(kvarn_scan_f16(bad.data(), shape, forward, &m, out.data(), forward) == KVARN_OK && m == INFINITY);
    bad[4] = 0x7e01;  // a NaN
    CHECK(kvarn_scan_f16(bad.data(), shape, forward, &m, out.data(), forward) == KVARN_OK && std::isnan(m));
    CHECK(out == std::vector<uint16_t>(x.size(), 0xabcd));
    // Empty: max 0, NULL pointers allowed. Refused: negative size, no max_abs, out without strides, misalignment.
    const int64_t empty[3] = {2, 0, 5};
    CHECK(kvarn_scan_f16(nullptr, empty, forward, &m, nullptr, forward) == KVARN_OK && m == 0.0f);
    const int64_t negative[3] = {2, -1, 5};
    CHECK(kvarn_scan_f16(x.data(), negative, forward, &m, nullptr, nullptr) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_scan_f16(x.data(), shape, forward, nullptr, nullptr, nullptr) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_scan_f16(x.data(), shape, forward, &m, out.data(), nullptr) == KVARN_ERR_ARGUMENT);
    const uint16_t* odd = reinterpret_cast<const uint16_t*>(reinterpret_cast<const char*>(x.data()) + 1);
    const int64_t one[3] = {1, 1, 1};
    CHECK(kvarn_scan_f16(odd, one, forward, &m, nullptr, nullptr) == KVARN_ERR_ARGUMENT);
}

// KVARN_ISA names an ISA that cannot run (asan.sh runs this once): every kernel call refuses with
// KVARN_ERR_ISA and writes nothing, the scalar-only ones included.
int unusable_isa_checks()
{
    const int G = 64, D = 16;
    alignas(8) double xd[D] = {1.0};
    std::vector<float> x(G * D, 1.0f), r(G), c(D), kk(G * D), vv(G * D);
    std::vector<uint8_t> rec(kvarn_layout(4, 2, G, D).total, 0xab);
    const std::vector<uint8_t> untouched = rec;
    CHECK(kvarn_hadamard_f32(x.data(), 1, D) == KVARN_ERR_ISA);
    CHECK(kvarn_hadamard_f64(xd, 1, D) == KVARN_ERR_ISA && xd[0] == 1.0);
    CHECK(kvarn_balance(x.data(), G, D, 1, r.data(), c.data()) == KVARN_ERR_ISA);
    CHECK(kvarn_quantize_tiles(x.data(), x.data(), 1, 4, 2, G, D, 1, rec.data(), 1, nullptr) == KVARN_ERR_ISA);
    CHECK(rec == untouched);
    CHECK(kvarn_dequantize_tiles(rec.data(), 1, 4, 2, G, D, kk.data(), vv.data()) == KVARN_ERR_ISA);
    CHECK(std::strstr(kvarn_isa_error(), "KVARN_ISA=") != nullptr);
    scan_checks();  // baseline code outside the kernel tables: it runs whatever KVARN_ISA says
    scan_f16_checks();
    std::printf("%s (KVARN_ISA=%s cannot run): %d failure(s)\n", failures ? "FAILED" : "ok", std::getenv("KVARN_ISA"),
                failures);
    return failures ? 1 : 0;
}

int main()
{
    if (!std::strcmp(kvarn_active_isa(), "none")) return unusable_isa_checks();
    std::printf("kvarn native test, ISA %s\n", kvarn_active_isa());
    scan_checks();
    scan_f16_checks();
    std::mt19937 gen(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int formats[][3] = {{4, 2, 128}, {4, 4, 64}, {2, 2, 128}, {8, 8, 64}};
    for (int D : {16, 48, 64, 80, 128, 256}) {
        for (auto& f : formats) {
            const int kb = f[0], vb = f[1], G = f[2];
            const int64_t tiles = 3;
            std::vector<float> k(tiles * G * D), v(k.size()), k2(k.size()), v2(k.size());
            for (auto& x : k) x = normal(gen);
            for (auto& x : v) x = normal(gen);
            const size_t rec = kvarn_layout(kb, vb, G, D).total;
            std::vector<uint8_t> records(tiles * rec);
            int64_t bad = -1;
            CHECK(kvarn_quantize_tiles(k.data(), v.data(), tiles, kb, vb, G, D, 8, records.data(), 2, &bad) == KVARN_OK);
            CHECK(kvarn_dequantize_tiles(records.data(), tiles, kb, vb, G, D, k2.data(), v2.data()) == KVARN_OK);
            double err = 0, ref = 0;
            for (size_t i = 0; i < k.size(); ++i) {
                err += (k[i] - k2[i]) * (k[i] - k2[i]);
                ref += k[i] * k[i];
            }
            CHECK(std::sqrt(err / ref) < (kb == 2 ? 0.6 : 0.15));

            // Attention over sink (odd length) + tiles + tail (odd length), GQA 4.
            const int Hk = 1, Hq = 4;
            for (int64_t sink_len : {0, 1, 7, 33}) {
                for (int64_t tail_len : {0, 1, 15, 17}) {
                    if (sink_len + tail_len == 0) continue;
                    std::vector<uint16_t> sk(sink_len * D + 1), sv(sk.size()), tk(tail_len * D + 1), tv(tk.size());
                    for (auto& x : sk) x = to_half(normal(gen));
                    for (auto& x : sv) x = to_half(normal(gen));
                    for (auto& x : tk) x = to_half(normal(gen));
                    for (auto& x : tv) x = to_half(normal(gen));
                    kvarn_cache_view c = tiles_view(records.data(), tiles, Hk, D, G, kb, vb, rec, rec);
                    c.sink_k = sk.data();
                    c.sink_v = sv.data();
                    c.sink_len = sink_len;
                    c.sink_head_stride = sink_len * D;
                    c.sink_row_stride = D;
                    c.tail_k = tk.data();
                    c.tail_v = tv.data();
                    c.tail_len = tail_len;
                    c.tail_head_stride = tail_len * D;
                    c.tail_row_stride = D;
                    std::vector<float> q(Hq * D), out(Hq * D, NAN);
                    for (auto& x : q) x = normal(gen);
                    for (int threads : {1, 3}) {
                        CHECK(kvarn_attend(&c, 1, q.data(), Hq, 0.125f, out.data(), threads) == KVARN_OK);
                        for (float o : out) CHECK(std::isfinite(o));
                    }
                }
            }
        }
    }
    {
        // Concurrent callers share one pool (a call that finds it busy runs its items on its own thread):
        // four threads attend with 2 threads each and quantise, 40 rounds; every result must equal the same
        // call made alone (the split layout follows the requested thread count, not who runs the items).
        // scripts/tsan.sh runs this under ThreadSanitizer. Results are compared after the joins: CHECK's
        // counter is not for several threads.
        const int G = 64, D = 32, Hk = 2, Hq = 8, tiles = 5, callers = 4, rounds = 40;
        TiledTail cache;
        make_tiled_tail(cache, gen, G, D, Hk, tiles, 9);
        const kvarn_cache_view& c = cache.view;
        const std::vector<float>&kk = cache.k, &vv = cache.v;
        const std::vector<uint8_t>& records = cache.records;
        std::vector<float> q((size_t)callers * Hq * D);
        for (auto& x : q) x = normal(gen);
        std::vector<float> alone(q.size());
        const size_t row = (size_t)Hq * D;  // one caller's query and output
        for (int i = 0; i < callers; ++i)
            CHECK(kvarn_attend(&c, 1, q.data() + i * row, Hq, 0.125f, alone.data() + i * row, 2) == KVARN_OK);
        std::vector<int> mismatches(callers, 0);
        std::vector<std::thread> pool_users;
        for (int i = 0; i < callers; ++i)
            pool_users.emplace_back([&, i] {
                std::vector<float> out(row);
                std::vector<uint8_t> again(records.size());
                for (int r = 0; r < rounds; ++r) {
                    if (kvarn_attend(&c, 1, q.data() + i * row, Hq, 0.125f, out.data(), 2) != KVARN_OK ||
                        std::memcmp(out.data(), alone.data() + i * row, row * sizeof(float)) != 0)
                        ++mismatches[i];
                    if (r % 8 == i) {
                        const int rc = kvarn_quantize_tiles(kk.data(), vv.data(), tiles * Hk, 4, 2, G, D, 8,
                                                            again.data(), 2, nullptr);
                        if (rc != KVARN_OK || again != records) ++mismatches[i];
                    }
                }
            });
        for (auto& t : pool_users) t.join();
        for (int i = 0; i < callers; ++i) CHECK(mismatches[i] == 0);
    }
    {
        // kvarn_attend_tokens: token i of n attends causally, bit-identical to kvarn_attend over the view cut
        // n - 1 - i tokens short (the cut in the tail here); hidden tokens inside a record are refused.
        const int G = 64, D = 32, Hk = 2, Hq = 8, tiles = 3, n = 4, tail = 9;
        TiledTail cache;
        make_tiled_tail(cache, gen, G, D, Hk, tiles, tail);
        const kvarn_cache_view& c = cache.view;
        const size_t row = (size_t)Hq * D;  // one token's queries
        std::vector<float> q(n * row), out(n * row, NAN), alone(row);
        for (auto& x : q) x = normal(gen);
        CHECK(kvarn_attend_tokens(&c, 1, n, q.data(), Hq, 0.125f, out.data(), 2) == KVARN_OK);
        for (int i = 0; i < n; ++i) {
            kvarn_cache_view cut = c;
            cut.tail_len = tail - (n - 1 - i);
            CHECK(kvarn_attend(&cut, 1, q.data() + i * row, Hq, 0.125f, alone.data(), 2) == KVARN_OK);
            CHECK(std::memcmp(out.data() + i * row, alone.data(), row * sizeof(float)) == 0);
        }
        std::vector<float> many_q((tail + 2) * row, 0.5f), many_out(many_q.size());
        // tail + 1 tokens: the first sees the records alone; one more would hide a record's last token
        CHECK(kvarn_attend_tokens(&c, 1, tail + 1, many_q.data(), Hq, 0.125f, many_out.data(), 1) == KVARN_OK);
        CHECK(kvarn_attend_tokens(&c, 1, tail + 2, many_q.data(), Hq, 0.125f, many_out.data(), 1) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_attend_tokens(&c, 1, 0, q.data(), Hq, 0.125f, out.data(), 1) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_attend_tokens(&c, 1, INT32_MAX / 4, q.data(), Hq, 0.125f, out.data(), 1) == KVARN_ERR_ARGUMENT);
    }
    // Argument checks return errors, never crash.
    float x[16] = {0};
    CHECK(kvarn_hadamard_f32(x, 1, 24) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_hadamard_f32(nullptr, 1, 16) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_hadamard_f32(nullptr, 0, 16) == KVARN_OK);  // no rows: NULL allowed, as for an empty view part
    CHECK(kvarn_hadamard_f64(nullptr, 0, 16) == KVARN_OK);
    CHECK(kvarn_quantize_tiles(nullptr, nullptr, 0, 4, 2, 128, 16, 8, nullptr, 1, nullptr) == KVARN_OK);  // likewise
    CHECK(kvarn_quantize_tiles(nullptr, x, 1, 4, 2, 128, 16, 8, nullptr, 1, nullptr) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_dequantize_tiles(nullptr, 0, 4, 2, 128, 16, nullptr, nullptr) == KVARN_OK);
    CHECK(kvarn_dequantize_tiles(nullptr, 1, 4, 2, 128, 16, x, x) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_quantize_tiles(nullptr, nullptr, 0, 3, 2, 128, 16, 8, nullptr, 1, nullptr) == KVARN_ERR_ARGUMENT);
    {
        // kvarn.h's alignment rule holds for kvarn_balance's buffers and quantize's bad_tile too
        // (UBSan reported misaligned loads / an int64 store there).
        alignas(8) float buf[64 * 16 + 2] = {0};
        float* odd = reinterpret_cast<float*>(reinterpret_cast<char*>(buf) + 2);
        std::vector<float> r(64), c(16);
        CHECK(kvarn_balance(odd, 64, 16, 1, r.data(), c.data()) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_balance(buf, 64, 16, 1, odd, c.data()) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_balance(buf, 64, 16, 1, r.data(), c.data()) == KVARN_OK);
        alignas(8) unsigned char bad_tile_bytes[16];
        std::vector<uint8_t> rec(kvarn_layout(4, 2, 64, 16).total);
        CHECK(kvarn_quantize_tiles(buf, buf, 1, 4, 2, 64, 16, 1, rec.data(), 1,
                                   reinterpret_cast<int64_t*>(bad_tile_bytes + 4)) == KVARN_ERR_ARGUMENT);
    }
    CHECK(kvarn_quantize_tiles(x, x, 1, 3, 2, 128, 16, 8, nullptr, 1, nullptr) == KVARN_ERR_ARGUMENT);
    CHECK(kvarn_attend(nullptr, 1, x, 4, 1.f, x, 1) == KVARN_ERR_ARGUMENT);
    kvarn_cache_view empty{};
    empty.num_kv_heads = 1;
    empty.head_dim = 16;
    CHECK(kvarn_attend(&empty, 1, x, 1, 1.f, x, 1) == KVARN_ERR_ARGUMENT);  // no tokens
    CHECK(kvarn_set_isa("sse9") == KVARN_ERR_ISA);
    {
        // No exception leaves a C entry point, even when an error's text cannot be allocated.
        g_fail_alloc = true;
        const int rc = kvarn_set_isa("an-isa-name-longer-than-any-short-string-buffer");
        const std::string text = (g_fail_alloc = false, kvarn_isa_error());  // copied unarmed
        CHECK(rc == KVARN_ERR_ISA);
        CHECK(text.find("out of memory") != std::string::npos);
        const std::string longer(300, 'x');  // longer than any text copied so far: the copy must allocate
        CHECK(kvarn_set_isa(longer.c_str()) == KVARN_ERR_ISA);
        g_fail_alloc = true;
        const char* copy_failed = kvarn_isa_error();
        g_fail_alloc = false;
        CHECK(std::strstr(copy_failed, "out of memory") != nullptr);
        CHECK(kvarn_set_isa(kvarn_active_isa()) == KVARN_OK);  // a later error text is stored again
        CHECK(kvarn_set_isa("sse9") == KVARN_ERR_ISA && std::strstr(kvarn_isa_error(), "sse9") != nullptr);
    }
    {
        // kvarn_quantize_tiles_typed: fp16 input, and float32 rounded to fp16 on the way in, give the
        // records of float32 input holding the fp16 values; an unknown input type is an argument error.
        const int G = 64, D = 32, n = 3;
        std::vector<float> k32(n * G * D), v32(n * G * D), k_rounded(n * G * D), v_rounded(n * G * D);
        std::vector<uint16_t> k16(n * G * D), v16(n * G * D);
        std::mt19937 g(5);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int i = 0; i < n * G * D; ++i) {
            k32[i] = nd(g) * 3.0f;
            v32[i] = nd(g) * 0.01f;
            k16[i] = kvarn::float_to_half(k32[i]);
            v16[i] = kvarn::float_to_half(v32[i]);
            k_rounded[i] = kvarn::half_to_float(k16[i]);
            v_rounded[i] = kvarn::half_to_float(v16[i]);
        }
        const size_t bytes = n * kvarn_layout(4, 2, G, D).total;
        std::vector<uint8_t> ref(bytes), got16(bytes), got_rounded(bytes), unrounded(bytes);
        CHECK(kvarn_quantize_tiles(k_rounded.data(), v_rounded.data(), n, 4, 2, G, D, 8, ref.data(), 2, nullptr) ==
              KVARN_OK);
        CHECK(kvarn_quantize_tiles_typed(k16.data(), v16.data(), KVARN_INPUT_F16, n, 4, 2, G, D, 8, got16.data(), 2,
                                         nullptr) == KVARN_OK);
        CHECK(kvarn_quantize_tiles_typed(k32.data(), v32.data(), KVARN_INPUT_F32_AS_F16, n, 4, 2, G, D, 8,
                                         got_rounded.data(), 2, nullptr) == KVARN_OK);
        CHECK(kvarn_quantize_tiles_typed(k32.data(), v32.data(), KVARN_INPUT_F32, n, 4, 2, G, D, 8, unrounded.data(),
                                         2, nullptr) == KVARN_OK);
        CHECK(got16 == ref);
        CHECK(got_rounded == ref);
        CHECK(unrounded != ref);  // the rounding is real: these inputs are not fp16 values
        CHECK(kvarn_quantize_tiles_typed(k16.data(), v16.data(), 3, n, 4, 2, G, D, 8, got16.data(), 2, nullptr) ==
              KVARN_ERR_ARGUMENT);
        CHECK(kvarn_quantize_tiles_typed(k16.data(), nullptr, KVARN_INPUT_F16, n, 4, 2, G, D, 8, got16.data(), 2,
                                         nullptr) == KVARN_ERR_ARGUMENT);
    }
    {
        // iters is bounded like the Python layer's (KVARN_MAX_SINKHORN_ITERS): 2**31 - 1 used to run
        // for minutes. The cap itself is accepted; one more is an argument error.
        const int G = 64, D = 16;
        std::vector<float> kk(G * D, 1.0f), vv(G * D, 1.0f), r(G), c(D);
        for (int i = 0; i < G * D; ++i) kk[i] = vv[i] = (float)(i % 7) - 3.0f;
        std::vector<uint8_t> rec(kvarn_layout(4, 2, G, D).total);
        CHECK(kvarn_quantize_tiles(kk.data(), vv.data(), 1, 4, 2, G, D, KVARN_MAX_SINKHORN_ITERS, rec.data(), 1,
                                   nullptr) == KVARN_OK);
        CHECK(kvarn_quantize_tiles(kk.data(), vv.data(), 1, 4, 2, G, D, KVARN_MAX_SINKHORN_ITERS + 1, rec.data(), 1,
                                   nullptr) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_balance(kk.data(), G, D, KVARN_MAX_SINKHORN_ITERS + 1, r.data(), c.data()) == KVARN_ERR_ARGUMENT);
    }
    {
        // kvarn_set_isa and kvarn_isa_error from several threads at once: the error text used to be
        // a global std::string assigned without a lock: heap corruption / double free (seen in a C
        // consumer; intermittent on a 2-core host), and a data race that a -fsanitize=thread build
        // of this driver reports on every run.
        auto setter = [](const char* name) {
            for (int i = 0; i < 200000; ++i) kvarn_set_isa(name);
        };
        size_t total = 0;
        std::thread a(setter, "a-long-unknown-isa-name-that-needs-the-heap"), b(setter, "b");
        std::thread r([&total] {
            for (int i = 0; i < 200000; ++i) total += std::strlen(kvarn_isa_error());
        });
        a.join();
        b.join();
        r.join();
        CHECK(total > 0);
        CHECK(std::string(kvarn_isa_error()).find("not a known ISA") != std::string::npos);
        const std::string isa = kvarn_active_isa();
        CHECK(kvarn_set_isa(isa.c_str()) == KVARN_OK);  // unchanged by the failed calls; clears the error
        CHECK(kvarn_isa_error()[0] == '\0');
    }
    {
        // Sizes whose byte counts overflow int64/size_t (no buffer can be that large) are argument
        // errors. They used to wrap: quantize of 2**62 tiles ran 2*n_tiles < 0 items and returned OK
        // without writing; hadamard of INT64_MAX rows returned OK; dequantize of INT64_MAX tiles,
        // attend with sink_len INT64_MAX and balance of INT32_MAX x INT32_MAX ran off their buffers.
        float buf[64 * 16] = {0};
        uint8_t rec[4096] = {0};
        const int64_t huge = std::numeric_limits<int64_t>::max();
        CHECK(kvarn_quantize_tiles(buf, buf, int64_t(1) << 62, 4, 2, 64, 16, 8, rec, 1, nullptr) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_quantize_tiles(buf, buf, huge, 4, 2, 64, 16, 8, rec, 1, nullptr) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_hadamard_f32(buf, huge, 16) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_hadamard_f32(buf, huge / 16, 16) == KVARN_ERR_ARGUMENT);  // rows * 16 fits, the bytes do not
        // Views: strides must be non-negative, record_tile_stride at least a record, spans must fit.
        std::vector<uint16_t> half(4 * 16, 0);
        kvarn_cache_view c{};
        c.num_kv_heads = 2;
        c.head_dim = 16;
        c.sink_k = c.sink_v = half.data();
        c.sink_len = 2;
        c.sink_head_stride = 2 * 16;
        c.sink_row_stride = 16;
        float qq[4 * 16] = {0}, oo[4 * 16];
        CHECK(kvarn_attend(&c, 1, qq, 4, 1.f, oo, 1) == KVARN_OK);
        c.sink_head_stride = -2 * 16;
        CHECK(kvarn_attend(&c, 1, qq, 4, 1.f, oo, 1) == KVARN_ERR_ARGUMENT);
        c.sink_head_stride = huge / 2;  // (Hk - 1) * head_stride elements of 2 bytes: past PTRDIFF_MAX
        CHECK(kvarn_attend(&c, 1, qq, 4, 1.f, oo, 1) == KVARN_ERR_ARGUMENT);
        c.sink_head_stride = 2 * 16;
        c.records = rec;
        c.num_tiles = 2;
        c.kbits = 4;
        c.vbits = 2;
        c.group = 64;
        c.record_head_stride = 0;
        c.record_tile_stride = (int64_t)kvarn_layout(4, 2, 64, 16).total - 1;  // records would overlap
        CHECK(kvarn_attend(&c, 1, qq, 4, 1.f, oo, 1) == KVARN_ERR_ARGUMENT);
        c.num_tiles = 0;
        c.sink_len = huge;
        CHECK(kvarn_attend(&c, 1, qq, 4, 1.f, oo, 1) == KVARN_ERR_ARGUMENT);
        c.sink_len = 2;
        c.tail_k = c.tail_v = half.data();
        c.tail_len = huge / 8;
        c.tail_row_stride = 16;
        CHECK(kvarn_attend(&c, 1, qq, 4, 1.f, oo, 1) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_dequantize_tiles(rec, huge, 4, 2, 64, 16, buf, buf) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_hadamard_f64(reinterpret_cast<double*>(buf), huge / 32, 16) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_balance(buf, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::max(), 1, buf,
                            buf) == KVARN_ERR_ARGUMENT);
    }
    // Misaligned pointers and record strides, and thread counts past KVARN_MAX_THREADS: refused (the scalar
    // kernels read fp16 fields as uint16_t; a huge count meant millions of split items).
    {
        const int G = 64, D = 16;
        const size_t rec = kvarn_layout(4, 2, G, D).total;
        std::vector<float> kk(2 * G * D + 1), vv(kk.size());
        for (auto& x : kk) x = normal(gen);
        for (auto& x : vv) x = normal(gen);
        std::vector<uint8_t> records(2 * rec + 2);
        CHECK(kvarn_quantize_tiles(kk.data(), vv.data(), 2, 4, 2, G, D, 8, records.data(), 1, nullptr) == KVARN_OK);
        CHECK(kvarn_quantize_tiles(kk.data(), vv.data(), 2, 4, 2, G, D, 8, records.data() + 1, 1, nullptr) ==
              KVARN_ERR_ARGUMENT);
        const void* odd_floats = reinterpret_cast<const char*>(kk.data()) + 2;
        CHECK(kvarn_quantize_tiles(static_cast<const float*>(odd_floats), vv.data(), 1, 4, 2, G, D, 8, records.data(),
                                   1, nullptr) == KVARN_ERR_ARGUMENT);
        std::vector<uint16_t> halves(G * D + 1);
        for (auto& x : halves) x = to_half(normal(gen));
        CHECK(kvarn_quantize_tiles_typed(halves.data() + 1, halves.data(), KVARN_INPUT_F16, 1, 4, 2, G, D, 8,
                                         records.data(), 1, nullptr) == KVARN_OK);  // fp16 input needs 2 bytes only
        CHECK(kvarn_quantize_tiles(kk.data(), vv.data(), 2, 4, 2, G, D, 8, records.data(), KVARN_MAX_THREADS + 1,
                                   nullptr) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_quantize_tiles(kk.data(), vv.data(), 2, 4, 2, G, D, 8, records.data(), 1, nullptr) == KVARN_OK);
        kvarn_cache_view c = tiles_view(records.data(), 2, 1, D, G, 4, 2, rec, rec);
        std::vector<float> q(4 * D + 1), out(4 * D + 1);
        for (auto& x : q) x = normal(gen);
        CHECK(kvarn_attend(&c, 1, q.data(), 4, 0.25f, out.data(), 2) == KVARN_OK);
        CHECK(kvarn_attend(&c, 1, q.data(), 4, 0.25f, out.data(), KVARN_MAX_THREADS) == KVARN_OK);
        CHECK(kvarn_attend(&c, 1, q.data(), 4, 0.25f, out.data(), KVARN_MAX_THREADS + 1) == KVARN_ERR_ARGUMENT);
        CHECK(kvarn_attend(&c, 1, q.data() + 1, 4, 0.25f, out.data(), 2) == KVARN_OK);  // 4-byte aligned: fine
        CHECK(kvarn_attend(&c, 1, reinterpret_cast<const float*>(reinterpret_cast<const char*>(q.data()) + 2), 4, 0.25f,
                           out.data(), 2) == KVARN_ERR_ARGUMENT);
        c.record_tile_stride = rec + 1;  // odd: the second record's fp16 fields misaligned
        CHECK(kvarn_attend(&c, 1, q.data(), 4, 0.25f, out.data(), 2) == KVARN_ERR_ARGUMENT);
        c.record_tile_stride = rec;
        c.records = records.data() + 1;
        CHECK(kvarn_attend(&c, 1, q.data(), 4, 0.25f, out.data(), 2) == KVARN_ERR_ARGUMENT);
        c.records = records.data();
        std::vector<uint16_t> sink(D + 1, 0x3c00);
        c.sink_k = sink.data() + 0;
        c.sink_v = reinterpret_cast<const uint16_t*>(reinterpret_cast<const char*>(sink.data()) + 1);
        c.sink_len = 1;
        c.sink_head_stride = D;
        c.sink_row_stride = D;
        CHECK(kvarn_attend(&c, 1, q.data(), 4, 0.25f, out.data(), 2) == KVARN_ERR_ARGUMENT);
        c.sink_len = 0;
        // A NaN in any scale field: a non-finite output, reported, in every score mode the ISA runs (the int16
        // weights' NaN used to make an integer overflow here, which UBSan reports). An Inf is not always
        // reported: an infinite kz or kt can give a token weight 0 and a finite output (kvarn.h). One NaN, then
        // two in a row: two NaN tokens' integer weights (INT_MIN each) in two lanes of one sum made avx512's
        // lane reduction overflow (signed, undefined; UBSan on the lent Xeon, thirty-ninth session).
        const kvarn_record_layout L = kvarn_layout(4, 2, G, D);
        const size_t fields[] = {L.ka, L.kz, L.kt, L.vc, L.va, L.vz};
        for (int mode : {0, 1, 2}) {
            if (kvarn_set_score_mode(mode) != KVARN_OK) continue;
            for (size_t off : fields)
                for (uint16_t bad : {(uint16_t)0x7e00, (uint16_t)0xfe01})  // quiet NaNs, either sign
                    for (int count : {1, 2}) {
                        std::vector<uint8_t> broken(records);
                        for (int e = 1; e <= count; ++e)  // tile 1, the field's second (and third) element
                            std::memcpy(broken.data() + rec + off + 2 * e, &bad, 2);
                        c.records = broken.data();
                        CHECK(kvarn_attend(&c, 1, q.data(), 4, 0.25f, out.data(), 2) == KVARN_ERR_OVERFLOW);
                    }
        }
        c.records = records.data();
        kvarn_set_score_mode(1);
    }
    // A row of +0 and -0 keeps +0 as its minimum on every ISA (records compare byte for byte).
    {
        const int G = 64, D = 16;
        std::vector<float> zk(G * D), zv(G * D);
        for (size_t i = 0; i < zk.size(); ++i) zk[i] = zv[i] = (i * 7 % 5 == 0) ? -0.0f : 0.0f;
        const kvarn_record_layout L = kvarn_layout(4, 2, G, D);
        std::vector<uint8_t> rec(L.total);
        CHECK(kvarn_quantize_tiles(zk.data(), zv.data(), 1, 4, 2, G, D, 8, rec.data(), 1, nullptr) == KVARN_OK);
        for (size_t i = 0; i < (size_t)D; ++i) CHECK(rec[L.kz + 2 * i + 1] == 0);    // kz: no sign bit
        for (size_t i = 0; i < (size_t)G; ++i) CHECK(rec[L.vz + 2 * i + 1] == 0);    // vz: no sign bit
    }
    {
        // fork() while another thread sets a bad ISA in a loop (holding the error text's lock at times):
        // each child must still read the error text (it used to hang on the lock copied locked).
        std::atomic<bool> stop{false};
        std::thread spinner([&stop] {
            while (!stop) {
                kvarn_set_isa("an-isa-name-long-enough-to-need-the-heap-for-its-text");
                (void)kvarn_isa_error();
            }
        });
        int hung = 0, other = 0;
        for (int i = 0; i < 200; ++i) {
            const pid_t child = fork();
            if (child == 0) {
                alarm(5);
                _exit(kvarn_isa_error() ? 0 : 1);
            }
            int status = 0;
            waitpid(child, &status, 0);
            if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) ++hung;
            else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++other;
        }
        stop = true;
        spinner.join();
        CHECK(hung == 0 && other == 0);
        CHECK(kvarn_set_isa(kvarn_active_isa()) == KVARN_OK);
    }
    // A throwing pool item (helper or calling thread) is an error after all other items finished.
    for (int on_helper : {1, 0}) {
        if (on_helper && kvarn_default_threads() < 2) continue;  // one CPU: no helper thread runs items
        int64_t finished = -1;
        int32_t faulted = 0;
        for (int attempt = 0; attempt < 5 && !faulted; ++attempt) {
            const int rc = kvarn_testing_pool_fault(64, 3, on_helper, &finished, &faulted);
            CHECK(rc == (faulted ? KVARN_ERR_INTERNAL : KVARN_OK));
        }
        CHECK(faulted == 1 && finished == 63);
    }
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
