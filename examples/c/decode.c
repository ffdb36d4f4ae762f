/*
 * kvarn from C (the C ABI of include/kvarn/kvarn.h, C99): one sequence's cache laid out as
 * kvarn.KVCache lays it out (a 128-token fp16 sink, 128-token k4v2 tiles, an fp16 tail), one
 * decode step of attention over it with kvarn_attend, and a check of the output against float64
 * softmax attention over what the cache holds (the tiles decoded by kvarn_dequantize_tiles, the
 * fp16 parts as stored). Then two bad calls, which must be refused without writing anything.
 *
 * Build: the CMake project builds it as kvarn_c_example (C99, linked to the static kvarn_core);
 * scripts/asan.sh runs it on every ISA the CPU has, under AddressSanitizer + UBSan.
 * Prints "kvarn C example, ISA <isa>: ... ok" and returns 0, or names what failed and returns 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvarn/kvarn.h"

enum {
    KV_HEADS = 2,
    Q_HEADS = 8, /* GQA: query head h reads KV head h / (Q_HEADS / KV_HEADS) */
    HEAD_DIM = 64,
    GROUP = 128, /* tokens per tile */
    SINK = 128,
    TILES = 3,
    TAIL = 45,
    TOKENS = SINK + TILES * GROUP + TAIL
};

static int failures = 0;

static void check(int ok, const char* what)
{
    if (!ok) {
        printf("FAILED: %s\n", what);
        ++failures;
    }
}

/* A value of an IEEE binary16 bit pattern (kvarn stores the sink and tail as such). */
static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    uint32_t bits;
    float f;
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24 */
        f = ldexpf((float)mantissa, -24);
        return sign ? -f : f;
    }
    bits = sign | (exponent == 31 ? 0x7f800000u : (exponent + 112) << 23) | (mantissa << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Deterministic test data: uniform in [-1, 1) from a 64-bit LCG. */
static uint64_t rng_state = 88172645463325252ull;
static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* The fp16 copy of tokens [first, first + n) of x [KV_HEADS][TOKENS][HEAD_DIM]: kvarn_scan_f32 checks them
 * (finite, within the fp16 range) and rounds them to binary16 as a cache stores them. */
static int store_fp16(const float* x, int64_t first, int64_t n, uint16_t* out)
{
    const int64_t shape[3] = {KV_HEADS, n, HEAD_DIM};
    const int64_t x_strides[3] = {(int64_t)TOKENS * HEAD_DIM, HEAD_DIM, 1};
    const int64_t out_strides[3] = {n * HEAD_DIM, HEAD_DIM, 1};
    float max_abs = 0.0f;
    return kvarn_scan_f32(x + first * HEAD_DIM, shape, x_strides, &max_abs, out, out_strides, 65504.0f);
}

/* Token t of KV head kv as the cache holds it: a row of the decoded tiles ([tile][head][GROUP][HEAD_DIM], as
 * kvarn_dequantize_tiles wrote them), or an fp16 sink / tail row converted into scratch. */
static const float* cached_row(const uint16_t* sink, const float* decoded, const uint16_t* tail, int kv, int64_t t,
                               float* scratch)
{
    const int64_t tail_start = SINK + TILES * GROUP;
    const uint16_t* half_row;
    int d;
    if (t >= SINK && t < tail_start) {
        const int64_t tile = (t - SINK) / GROUP, row = (t - SINK) % GROUP;
        return decoded + ((size_t)(tile * KV_HEADS + kv) * GROUP + (size_t)row) * HEAD_DIM;
    }
    half_row = t < SINK ? sink + ((size_t)kv * SINK + (size_t)t) * HEAD_DIM
                        : tail + ((size_t)kv * TAIL + (size_t)(t - tail_start)) * HEAD_DIM;
    for (d = 0; d < HEAD_DIM; ++d) scratch[d] = half_to_float(half_row[d]);
    return scratch;
}

int main(void)
{
    const kvarn_record_layout layout = kvarn_layout(4, 2, GROUP, HEAD_DIM);
    const size_t record_bytes = layout.total;
    const int64_t n_records = (int64_t)TILES * KV_HEADS; /* tile-major: record (i, h) at i * KV_HEADS + h */
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    float* k = malloc(sizeof(float) * KV_HEADS * TOKENS * HEAD_DIM);
    float* v = malloc(sizeof(float) * KV_HEADS * TOKENS * HEAD_DIM);
    float* q = malloc(sizeof(float) * Q_HEADS * HEAD_DIM);
    float* out = malloc(sizeof(float) * Q_HEADS * HEAD_DIM);
    float* tiles_k = malloc(sizeof(float) * n_records * GROUP * HEAD_DIM);
    float* tiles_v = malloc(sizeof(float) * n_records * GROUP * HEAD_DIM);
    float* decoded_k = malloc(sizeof(float) * n_records * GROUP * HEAD_DIM);
    float* decoded_v = malloc(sizeof(float) * n_records * GROUP * HEAD_DIM);
    uint16_t* sink_k = malloc(sizeof(uint16_t) * KV_HEADS * SINK * HEAD_DIM);
    uint16_t* sink_v = malloc(sizeof(uint16_t) * KV_HEADS * SINK * HEAD_DIM);
    uint16_t* tail_k = malloc(sizeof(uint16_t) * KV_HEADS * TAIL * HEAD_DIM);
    uint16_t* tail_v = malloc(sizeof(uint16_t) * KV_HEADS * TAIL * HEAD_DIM);
    uint8_t* records = malloc(record_bytes * (size_t)n_records);
    double* scores = malloc(sizeof(double) * TOKENS);
    int64_t i, t, bad_tile = -1;
    int h, d, rc;
    double max_error = 0.0, max_out = 0.0;

    if (!k || !v || !q || !out || !tiles_k || !tiles_v || !decoded_k || !decoded_v || !sink_k || !sink_v || !tail_k ||
        !tail_v || !records || !scores) {
        printf("FAILED: out of memory\n");
        return 1;
    }
    /* Keys with a few large channels (as real keys have), values with per-token scales. */
    for (h = 0; h < KV_HEADS; ++h)
        for (t = 0; t < TOKENS; ++t) {
            const float token_scale = 0.25f + 1.5f * (uniform() + 1.0f);
            for (d = 0; d < HEAD_DIM; ++d) {
                const size_t at = ((size_t)h * TOKENS + (size_t)t) * HEAD_DIM + (size_t)d;
                k[at] = uniform() * (d % 16 == 3 ? 6.0f : 1.0f);
                v[at] = uniform() * token_scale;
            }
        }
    for (i = 0; i < Q_HEADS * HEAD_DIM; ++i) q[i] = 2.0f * uniform();

    /* The cache: fp16 sink and tail, and the full tiles between them quantised (rounded to fp16 first, as a
     * cache's tokens are). */
    check(store_fp16(k, 0, SINK, sink_k) == KVARN_OK && store_fp16(v, 0, SINK, sink_v) == KVARN_OK, "sink to fp16");
    check(store_fp16(k, SINK + TILES * GROUP, TAIL, tail_k) == KVARN_OK &&
              store_fp16(v, SINK + TILES * GROUP, TAIL, tail_v) == KVARN_OK, "tail to fp16");
    for (i = 0; i < TILES; ++i)
        for (h = 0; h < KV_HEADS; ++h) {
            const size_t from = ((size_t)h * TOKENS + SINK + (size_t)i * GROUP) * HEAD_DIM;
            const size_t to = (size_t)(i * KV_HEADS + h) * GROUP * HEAD_DIM;
            memcpy(tiles_k + to, k + from, sizeof(float) * GROUP * HEAD_DIM);
            memcpy(tiles_v + to, v + from, sizeof(float) * GROUP * HEAD_DIM);
        }
    rc = kvarn_quantize_tiles_typed(tiles_k, tiles_v, KVARN_INPUT_F32_AS_F16, n_records, 4, 2, GROUP, HEAD_DIM,
                                    KVARN_SINKHORN_ITERS, records, 0, &bad_tile);
    check(rc == KVARN_OK, "kvarn_quantize_tiles_typed");

    {
        kvarn_cache_view view;
        memset(&view, 0, sizeof view);
        view.num_kv_heads = KV_HEADS;
        view.head_dim = HEAD_DIM;
        view.group = GROUP;
        view.kbits = 4;
        view.vbits = 2;
        view.sink_k = sink_k;
        view.sink_v = sink_v;
        view.sink_len = SINK;
        view.sink_head_stride = (int64_t)SINK * HEAD_DIM;
        view.sink_row_stride = HEAD_DIM;
        view.records = records;
        view.num_tiles = TILES;
        view.record_tile_stride = (int64_t)(KV_HEADS * record_bytes);
        view.record_head_stride = (int64_t)record_bytes;
        view.tail_k = tail_k;
        view.tail_v = tail_v;
        view.tail_len = TAIL;
        view.tail_head_stride = (int64_t)TAIL * HEAD_DIM;
        view.tail_row_stride = HEAD_DIM;
        rc = kvarn_attend(&view, 1, q, Q_HEADS, scale, out, 0);
        check(rc == KVARN_OK, "kvarn_attend");

        /* Bad calls are refused and write nothing: query heads that are not a multiple of the KV heads, and a
         * view whose tiles overlap (a record stride below the record size). */
        {
            float untouched[Q_HEADS * HEAD_DIM];
            kvarn_cache_view overlapping = view;
            for (i = 0; i < Q_HEADS * HEAD_DIM; ++i) untouched[i] = -7.0f;
            check(kvarn_attend(&view, 1, q, 3, scale, untouched, 0) == KVARN_ERR_ARGUMENT,
                  "3 query heads over 2 KV heads refused");
            overlapping.record_tile_stride = (int64_t)record_bytes - 2;
            check(kvarn_attend(&overlapping, 1, q, Q_HEADS, scale, untouched, 0) == KVARN_ERR_ARGUMENT,
                  "a record stride below the record size refused");
            for (i = 0; i < Q_HEADS * HEAD_DIM; ++i) check(untouched[i] == -7.0f, "a refused call wrote nothing");
        }
    }

    /* Reference: float64 softmax attention over what the cache holds. */
    rc = kvarn_dequantize_tiles(records, n_records, 4, 2, GROUP, HEAD_DIM, decoded_k, decoded_v);
    check(rc == KVARN_OK, "kvarn_dequantize_tiles");
    for (h = 0; h < Q_HEADS; ++h) {
        const int kv = h / (Q_HEADS / KV_HEADS);
        const float* qh = q + (size_t)h * HEAD_DIM;
        double top = -INFINITY, total = 0.0, acc[HEAD_DIM];
        float row[HEAD_DIM];
        for (t = 0; t < TOKENS; ++t) {
            const float* key = cached_row(sink_k, decoded_k, tail_k, kv, t, row);
            double s = 0.0;
            for (d = 0; d < HEAD_DIM; ++d) s += (double)qh[d] * key[d];
            scores[t] = s * scale;
            if (scores[t] > top) top = scores[t];
        }
        for (d = 0; d < HEAD_DIM; ++d) acc[d] = 0.0;
        for (t = 0; t < TOKENS; ++t) {
            const double p = exp(scores[t] - top);
            const float* value = cached_row(sink_v, decoded_v, tail_v, kv, t, row);
            total += p;
            for (d = 0; d < HEAD_DIM; ++d) acc[d] += p * value[d];
        }
        for (d = 0; d < HEAD_DIM; ++d) {
            const double expected = acc[d] / total, error = fabs(out[(size_t)h * HEAD_DIM + d] - expected);
            if (error > max_error) max_error = error;
            if (fabs(expected) > max_out) max_out = fabs(expected);
        }
    }
    /* kvarn's default int16 score mode rounds the query and the value weights to 15 bits per tile (docs/simd.md):
     * measured here 8.8e-5 of max |out| on avx2, 1.1e-5 on the scalar kernels (float). */
    check(max_out > 0.0 && max_error <= 2e-3 * max_out, "output within 2e-3 of the float64 reference");
    printf("kvarn C example, ISA %s: %d tokens (%d fp16 sink, %d k4v2 tiles, %d fp16 tail), %d query heads over %d KV "
           "heads, max |out - float64 reference| %.2e of max |out| %.3f: %s\n",
           kvarn_active_isa(), TOKENS, SINK, TILES, TAIL, Q_HEADS, KV_HEADS, max_error / max_out, max_out,
           failures ? "FAILED" : "ok");
    free(k), free(v), free(q), free(out), free(tiles_k), free(tiles_v), free(decoded_k), free(decoded_v);
    free(sink_k), free(sink_v), free(tail_k), free(tail_v), free(records), free(scores);
    return failures ? 1 : 0;
}
