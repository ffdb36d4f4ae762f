// kvarn kernel table: the contract every ISA implementation (scalar, avx2,
// avx512) fulfils. Kernels take plain pointers and sizes only, never vector
// types, so each ISA lives in its own translation unit with its own compile
// flags and nothing else in the library is built for more than the baseline.
#ifndef KVARN_KERNELS_H
#define KVARN_KERNELS_H

#include <cstddef>
#include <cstdint>

#include "kvarn/format.h"
#include "kvarn/kvarn.h"  // KVARN_INPUT_*

namespace kvarn {

struct TileFormat {
    int kbits;
    int vbits;
    int group;     // G, tokens per tile
    int head_dim;  // D
};

// A free function with internal linkage, not an inline member: an inline member is one weak symbol shared by
// every file, and the linker may keep the copy compiled with AVX-512 flags for the baseline code to call.
static inline kvarn_record_layout record_layout(const TileFormat& f)
{
    return kvarn_layout(f.kbits, f.vbits, f.group, f.head_dim);
}

// Running online-softmax state of one GQA group (n_q query heads sharing a KV
// head). Caller-owned. Scores are already multiplied by the softmax scale
// (q is pre-scaled), and m starts at -inf, l and both accumulators at 0.
// Full-precision tokens (sink, tail, fp16 cache) accumulate in the original
// frame, quantised tiles in the rotated frame; both share m and l, so every
// rescale by exp(m_old - m_new) applies to both.
struct SoftmaxState {
    float* m;         // [n_q]
    float* l;         // [n_q]
    float* acc_orig;  // [n_q][D]
    float* acc_rot;   // [n_q][D]
};

// In place, orthonormal block-diagonal Walsh-Hadamard along rows of D floats.
using HadamardF32Fn = void (*)(float* x, int64_t rows, int head_dim);

// Quantise one (tile, head): k and v are [G][D] in the original frame, in input_type's format
// (KVARN_INPUT_F32: float32; KVARN_INPUT_F16: binary16 bits; KVARN_INPUT_F32_AS_F16: float32
// rounded to binary16 first), converted as the rotation loads them (no float32 copy of the tile).
// Writes one record (format.h), or only its K or V half (parts: a mask of
// kQuantizeK / kQuantizeV; the halves are disjoint bytes, so two threads may
// write one record's halves at once). Returns 0, or 1 when a folded fp16 scale
// vector would not be finite (input too large for fp16 scales).
constexpr int kQuantizeK = 1, kQuantizeV = 2, kQuantizeKV = 3;
using QuantizeTileFn = int (*)(const void* k, const void* v, int input_type, const TileFormat& fmt, int iters,
                               uint8_t* record, int parts);

// Online-softmax attention of n_q pre-scaled, rotated queries q_rot [n_q][D]
// over n_tiles consecutive records of one KV head, record i at
// first_record + i * tile_stride bytes. Updates st (acc_rot).
using AttendTilesFn = void (*)(const float* q_rot, int n_q, const TileFormat& fmt,
                               const uint8_t* first_record, int64_t n_tiles, int64_t tile_stride,
                               SoftmaxState st);

// Online-softmax attention of n_q pre-scaled queries q [n_q][D] (original
// frame) over n full-precision fp16 tokens of one KV head: token t's K row at
// k + t * row_stride, V row at v + t * row_stride (elements). Updates st (acc_orig).
using AttendDenseF16Fn = void (*)(const float* q, int n_q, int head_dim, const uint16_t* k,
                                  const uint16_t* v, int64_t n, int64_t row_stride,
                                  SoftmaxState st);

// n input values (KVARN_INPUT_F16 bits, or KVARN_INPUT_F32_AS_F16 floats rounded to binary16
// and back, ties to even) as float32 into dst: the quantiser's input for those formats (its
// rotation converts as it loads where it can, and calls this for the rest).
using ToFloatFn = void (*)(const void* src, int input_type, float* dst, int64_t n);

struct KernelTable {
    const char* name;
    HadamardF32Fn hadamard_f32;
    QuantizeTileFn quantize_tile;
    AttendTilesFn attend_tiles;
    AttendDenseF16Fn attend_dense_f16;
    ToFloatFn to_float;
};

// Each returns the ISA's table, or nullptr when the library was built without
// it. Entries left nullptr fall back to the next lower ISA (avx512 -> avx2 -> scalar).
const KernelTable* scalar_kernels();
const KernelTable* avx2_kernels();
const KernelTable* avx512_kernels();

// Shared scalar helpers (native/cpu/scalar), usable by every ISA file for tails.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);  // round to nearest even, overflow -> inf

}  // namespace kvarn

#endif  // KVARN_KERNELS_H
