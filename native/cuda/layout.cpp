// The one bridge from format.h to the CUDA code (see layout.h).
#include "layout.h"

#include "kvarn/format.h"
#include "kvarn_cuda.h"

namespace kvarn_cuda {

RecordLayout record_layout(int kbits, int vbits, int group, int head_dim)
{
    const kvarn_record_layout L = kvarn_layout(kbits, vbits, group, head_dim);
    return RecordLayout{(int64_t)L.k_codes, (int64_t)L.ka,      (int64_t)L.kz, (int64_t)L.kt, (int64_t)L.v_codes,
                        (int64_t)L.vc,      (int64_t)L.va,      (int64_t)L.vz, (int64_t)L.total};
}

}  // namespace kvarn_cuda

extern "C" int kvarn_cuda_layout(int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim, int64_t out[9])
{
    if (!out || !kvarn_bits_supported(kbits) || !kvarn_bits_supported(vbits) || !kvarn_group_supported(group) ||
        !kvarn_head_dim_supported(head_dim))
        return KVARN_CUDA_ERR_ARGUMENT;
    const kvarn_cuda::RecordLayout L = kvarn_cuda::record_layout(kbits, vbits, group, head_dim);
    const int64_t v[9] = {L.k_codes, L.ka, L.kz, L.kt, L.v_codes, L.vc, L.va, L.vz, L.total};
    for (int i = 0; i < 9; ++i) out[i] = v[i];
    return KVARN_CUDA_OK;
}

extern "C" int kvarn_cuda_format_supported(int32_t kbits, int32_t vbits, int32_t group, int32_t head_dim)
{
    // The preset combinations the attention kernels are instantiated for (attend_d*.cu).
    const bool combo = (kbits == 4 && vbits == 2 && group == 128) || (kbits == 4 && vbits == 4 && group == 128) ||
                       (kbits == 4 && vbits == 2 && group == 64) || (kbits == 4 && vbits == 4 && group == 64) ||
                       (kbits == 2 && vbits == 2 && group == 128);
    return combo && (head_dim == 64 || head_dim == 128 || head_dim == 256);
}
