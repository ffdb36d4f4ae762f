// Record field offsets for the CUDA kernels. Filled on the host from format.h's
// kvarn_layout() (layout.cpp, compiled as plain C++), never computed in CUDA
// code, so the byte layout has exactly one definition.
#pragma once

#include <stdint.h>

namespace kvarn_cuda {

struct RecordLayout {
    int64_t k_codes, ka, kz, kt, v_codes, vc, va, vz, total;
};

RecordLayout record_layout(int kbits, int vbits, int group, int head_dim);

}  // namespace kvarn_cuda
