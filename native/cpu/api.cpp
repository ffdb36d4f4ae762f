// The C ABI: argument checks, loops over tiles, heads and sequences, thread
// fan-out and the split-K merge. Kernels come from the active ISA table.
// Nothing here throws across the ABI: every entry point catches and returns a status.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "dispatch.h"
#include "kvarn/kvarn.h"

using kvarn::KernelTable;
using kvarn::SoftmaxState;
using kvarn::TileFormat;

namespace {

bool format_ok(int kbits, int vbits, int group, int head_dim)
{
    return kvarn_bits_supported(kbits) && kvarn_bits_supported(vbits) && kvarn_group_supported(group) &&
           kvarn_head_dim_supported(head_dim);
}

int resolve_threads(int32_t requested)
{
    return requested > 0 ? requested : kvarn_default_threads();
}

template <typename F>
int guarded(F&& body)
{
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return KVARN_ERR_INTERNAL;
    } catch (...) {
        return KVARN_ERR_INTERNAL;
    }
}

// A sequence is cut into units for splitting: the sink in chunks of
// kSinkChunk tokens, then one unit per tile, then the tail as one unit. An fp16
// cache (everything in the sink) therefore splits as well as a quantised one.
constexpr int64_t kSinkChunk = 128;

// One unit of attention work: a KV head of one sequence, over a contiguous
// range of its units.
struct WorkItem {
    int32_t seq, kv_head, split, n_splits;
    int64_t unit_begin, unit_end;
};

int64_t sink_units(const kvarn_cache_view& c) { return (c.sink_len + kSinkChunk - 1) / kSinkChunk; }
int64_t total_units(const kvarn_cache_view& c) { return sink_units(c) + c.num_tiles + (c.tail_len > 0 ? 1 : 0); }

}  // namespace

extern "C" {

int32_t kvarn_default_threads(void)
{
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

int kvarn_hadamard_f32(float* x, int64_t rows, int32_t head_dim)
{
    if (!x || rows < 0 || !kvarn_head_dim_supported(head_dim)) return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;
    kt->hadamard_f32(x, rows, head_dim);
    return KVARN_OK;
}

int kvarn_hadamard_f64(double* x, int64_t rows, int32_t head_dim)
{
    if (!x || rows < 0 || !kvarn_head_dim_supported(head_dim)) return KVARN_ERR_ARGUMENT;
    kvarn::hadamard_f64_rows(x, rows, head_dim);
    return KVARN_OK;
}

int kvarn_quantize_tiles(const float* k, const float* v, int64_t n_tiles, int32_t kbits, int32_t vbits,
                         int32_t group, int32_t head_dim, int32_t iters, uint8_t* records, int32_t num_threads,
                         int64_t* bad_tile)
{
    if (!k || !v || !records || n_tiles < 0 || iters < 0 || !format_ok(kbits, vbits, group, head_dim))
        return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;
    const TileFormat fmt{kbits, vbits, group, head_dim};
    const size_t rec_bytes = fmt.layout().total;
    const size_t tile_elems = (size_t)group * head_dim;
    int64_t first_bad = std::numeric_limits<int64_t>::max();
    bool failed_internal = false;
    const int threads = (int)std::min<int64_t>(resolve_threads(num_threads), std::max<int64_t>(n_tiles, 1));
#pragma omp parallel for schedule(dynamic) num_threads(threads) reduction(min : first_bad)
    for (int64_t i = 0; i < n_tiles; ++i) {
        try {
            if (kt->quantize_tile(k + i * tile_elems, v + i * tile_elems, fmt, iters, records + i * rec_bytes))
                first_bad = std::min(first_bad, i);
        } catch (...) {
#pragma omp atomic write
            failed_internal = true;
        }
    }
    if (failed_internal) return KVARN_ERR_INTERNAL;
    if (first_bad != std::numeric_limits<int64_t>::max()) {
        if (bad_tile) *bad_tile = first_bad;
        return KVARN_ERR_OVERFLOW;
    }
    return KVARN_OK;
}

int kvarn_dequantize_tiles(const uint8_t* records, int64_t n_tiles, int32_t kbits, int32_t vbits, int32_t group,
                           int32_t head_dim, float* k, float* v)
{
    if (!records || !k || !v || n_tiles < 0 || !format_ok(kbits, vbits, group, head_dim))
        return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;
    const int G = group, D = head_dim;
    const kvarn_record_layout L = kvarn_layout(kbits, vbits, group, head_dim);
    const size_t krow = kvarn_packed_row_bytes(G, kbits), vrow = kvarn_packed_row_bytes(D, vbits);
    auto code = [](const uint8_t* row, int i, int bits) {
        const int per_byte = 8 / bits;
        return (float)((row[i / per_byte] >> ((i % per_byte) * bits)) & ((1u << bits) - 1u));
    };
    auto f16 = [](const uint8_t* base, size_t off, int i) {
        uint16_t h;
        std::memcpy(&h, base + off + 2 * (size_t)i, 2);
        return kvarn::half_to_float(h);
    };
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const uint8_t* rec = records + tile * L.total;
        float* kout = k + tile * (int64_t)G * D;
        float* vout = v + tile * (int64_t)G * D;
        for (int t = 0; t < G; ++t)
            for (int d = 0; d < D; ++d) {
                kout[t * D + d] =
                    (code(rec + L.k_codes + d * krow, t, kbits) * f16(rec, L.ka, d) + f16(rec, L.kz, d)) *
                    f16(rec, L.kt, t);
                vout[t * D + d] =
                    (code(rec + L.v_codes + t * vrow, d, vbits) * f16(rec, L.va, t) + f16(rec, L.vz, t)) *
                    f16(rec, L.vc, d);
            }
        // Back to the original frame: H is its own inverse.
        kt->hadamard_f32(kout, G, D);
        kt->hadamard_f32(vout, G, D);
    }
    return KVARN_OK;
}

static bool view_ok(const kvarn_cache_view& c, int32_t num_q_heads)
{
    if (c.num_kv_heads <= 0 || num_q_heads % c.num_kv_heads != 0) return false;
    if (!kvarn_head_dim_supported(c.head_dim)) return false;
    if (c.sink_len < 0 || c.num_tiles < 0 || c.tail_len < 0) return false;
    if (c.sink_len + c.num_tiles + c.tail_len == 0) return false;
    if (c.sink_len > 0 && (!c.sink_k || !c.sink_v || c.sink_row_stride < c.head_dim)) return false;
    if (c.tail_len > 0 && (!c.tail_k || !c.tail_v || c.tail_row_stride < c.head_dim)) return false;
    if (c.num_tiles > 0 && (!c.records || !format_ok(c.kbits, c.vbits, c.group, c.head_dim))) return false;
    return true;
}

int kvarn_attend(const kvarn_cache_view* caches, int32_t batch, const float* q, int32_t num_q_heads, float scale,
                 float* out, int32_t num_threads)
{
    if (!caches || !q || !out || batch <= 0 || num_q_heads <= 0 || !std::isfinite(scale))
        return KVARN_ERR_ARGUMENT;
    const int D = caches[0].head_dim;
    for (int32_t b = 0; b < batch; ++b)
        if (!view_ok(caches[b], num_q_heads) || caches[b].head_dim != D ||
            caches[b].num_kv_heads != caches[0].num_kv_heads)
            return KVARN_ERR_ARGUMENT;
    const KernelTable* kt = kvarn::active_kernels();
    if (!kt) return KVARN_ERR_ISA;

    return guarded([&]() -> int {
        const int Hk = caches[0].num_kv_heads;
        const int n_q = num_q_heads / Hk;
        const int threads = resolve_threads(num_threads);

        // Split long caches across threads (flash-decoding): about two work
        // items per thread so dynamic scheduling can even out, never fewer than
        // 4 units (tiles or 128-token fp16 chunks) per split.
        std::vector<WorkItem> items;
        const int64_t heads_total = (int64_t)batch * Hk;
        for (int32_t b = 0; b < batch; ++b) {
            const int64_t U = total_units(caches[b]);
            int64_t want = (2 * (int64_t)threads + heads_total - 1) / heads_total;
            int64_t splits = std::max<int64_t>(1, std::min<int64_t>(want, U / 4));
            for (int h = 0; h < Hk; ++h)
                for (int64_t s = 0; s < splits; ++s)
                    items.push_back({b, h, (int32_t)s, (int32_t)splits, U * s / splits, U * (s + 1) / splits});
        }

        // Per item: m[n_q], l[n_q], acc_orig[n_q*D], acc_rot[n_q*D]; per (seq, head): rotated queries.
        const size_t state_floats = (size_t)n_q * (2 + 2 * (size_t)D);
        std::vector<float> states(items.size() * state_floats);
        std::vector<float> q_scaled((size_t)batch * num_q_heads * D), q_rot(q_scaled.size());
        for (size_t i = 0; i < q_scaled.size(); ++i) q_scaled[i] = q[i] * scale;
        std::memcpy(q_rot.data(), q_scaled.data(), q_rot.size() * sizeof(float));
        kt->hadamard_f32(q_rot.data(), (int64_t)batch * num_q_heads, D);

        const int64_t n_items = (int64_t)items.size();
        const int team = (int)std::min<int64_t>(threads, n_items);
#pragma omp parallel for schedule(dynamic) num_threads(team)
        for (int64_t i = 0; i < n_items; ++i) {
            const WorkItem& w = items[i];
            const kvarn_cache_view& c = caches[w.seq];
            float* base = states.data() + i * state_floats;
            SoftmaxState st{base, base + n_q, base + 2 * n_q, base + 2 * n_q + (size_t)n_q * D};
            std::fill(st.m, st.m + n_q, -std::numeric_limits<float>::infinity());
            std::fill(st.l, st.l + n_q, 0.0f);
            std::fill(st.acc_orig, st.acc_orig + 2 * (size_t)n_q * D, 0.0f);
            const size_t q_off = ((size_t)w.seq * num_q_heads + (size_t)w.kv_head * n_q) * D;
            const int64_t su = sink_units(c);
            // Sink chunks [unit_begin, min(unit_end, su)).
            const int64_t s0 = std::min(w.unit_begin, su), s1 = std::min(w.unit_end, su);
            if (s1 > s0) {
                const int64_t t0 = s0 * kSinkChunk, t1 = std::min(s1 * kSinkChunk, c.sink_len);
                const int64_t off = w.kv_head * c.sink_head_stride + t0 * c.sink_row_stride;
                kt->attend_dense_f16(q_scaled.data() + q_off, n_q, D, c.sink_k + off, c.sink_v + off, t1 - t0,
                                     c.sink_row_stride, st);
            }
            // Tiles [unit_begin - su, unit_end - su) clipped to [0, num_tiles).
            const int64_t tb = std::max<int64_t>(w.unit_begin - su, 0);
            const int64_t te = std::min<int64_t>(w.unit_end - su, c.num_tiles);
            if (te > tb) {
                const TileFormat fmt{c.kbits, c.vbits, c.group, c.head_dim};
                kt->attend_tiles(q_rot.data() + q_off, n_q, fmt,
                                 c.records + w.kv_head * c.record_head_stride + tb * c.record_tile_stride, te - tb,
                                 c.record_tile_stride, st);
            }
            if (c.tail_len > 0 && w.unit_end == total_units(c))
                kt->attend_dense_f16(q_scaled.data() + q_off, n_q, D, c.tail_k + w.kv_head * c.tail_head_stride,
                                     c.tail_v + w.kv_head * c.tail_head_stride, c.tail_len, c.tail_row_stride, st);
        }

        // Merge the splits of each (seq, kv head) and rotate the tile part back.
        std::vector<float> rot_sum((size_t)batch * num_q_heads * D, 0.0f);
        for (int64_t first = 0; first < n_items;) {
            const WorkItem& w0 = items[first];
            const int64_t n = w0.n_splits;
            for (int h = 0; h < n_q; ++h) {
                float m = -std::numeric_limits<float>::infinity();
                for (int64_t s = 0; s < n; ++s) m = std::max(m, states[(first + s) * state_floats + h]);
                float l = 0.0f;
                const size_t row = ((size_t)w0.seq * num_q_heads + (size_t)w0.kv_head * n_q + h) * D;
                float* o = out + row;
                float* r = rot_sum.data() + row;
                std::fill(o, o + D, 0.0f);
                for (int64_t s = 0; s < n; ++s) {
                    const float* base = states.data() + (first + s) * state_floats;
                    if (base[n_q + h] == 0.0f) continue;  // split saw no tokens for this head
                    const float wgt = std::exp(base[h] - m);
                    l += wgt * base[n_q + h];
                    const float* ao = base + 2 * n_q + (size_t)h * D;
                    const float* ar = base + 2 * n_q + (size_t)n_q * D + (size_t)h * D;
                    for (int d = 0; d < D; ++d) {
                        o[d] += wgt * ao[d];
                        r[d] += wgt * ar[d];
                    }
                }
                const float inv = 1.0f / l;
                for (int d = 0; d < D; ++d) {
                    o[d] *= inv;
                    r[d] *= inv;
                }
            }
            first += n;
        }
        kt->hadamard_f32(rot_sum.data(), (int64_t)batch * num_q_heads, D);
        for (size_t i = 0; i < rot_sum.size(); ++i) out[i] += rot_sum[i];
        return KVARN_OK;
    });
}

}  // extern "C"
