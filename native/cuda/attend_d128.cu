// attend_kernel instances for head_dim 128 (one file per head_dim: parallel, bounded compiles).
#include <cstdlib>

#include "attend.cuh"

namespace kvarn_cuda {

int launch_attend_d128(int kbits, int vbits, int group, const AttendArgs& a, int batch, int max_smem, cudaStream_t stream)
{
    if (kbits == 4 && vbits == 2 && group == 128) {
        // A/B switch for the device runs (temporary): KVARN_ATTEND_VARIANT=0 the previous kernel,
        // 1: its latency trims, 2: 12 warps with split K/V stage loads, 3: 8 warps so;
        // 4 (default): swapped operands where a program has <= 4 query heads, else 1; 5: 4 at 12 warps.
        static const int variant = [] {
            const char* e = std::getenv("KVARN_ATTEND_VARIANT");
            return e ? std::atoi(e) : 4;
        }();
        const int group_q = a.num_q_heads / a.c.num_kv_heads;
        if (variant == 4 && group_q <= 4) return launch_attend_t<4, 2, 128, 128, 8, 16, 4>(a, batch, max_smem, stream);
        if (variant == 5 && group_q <= 4) return launch_attend_t<4, 2, 128, 128, 12, 16, 4>(a, batch, max_smem, stream);
        if (variant == 0) return launch_attend_t<4, 2, 128, 128, 8, 16, 0>(a, batch, max_smem, stream);
        if (variant == 2) return launch_attend_t<4, 2, 128, 128, 12, 8, 2>(a, batch, max_smem, stream);
        if (variant == 3) return launch_attend_t<4, 2, 128, 128, 8, 16, 2>(a, batch, max_smem, stream);
        return launch_attend_t<4, 2, 128, 128>(a, batch, max_smem, stream);
    }
    if (kbits == 4 && vbits == 4 && group == 128) return launch_attend_t<4, 4, 128, 128>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 2 && group == 64) return launch_attend_t<4, 2, 64, 128>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 4 && group == 64) return launch_attend_t<4, 4, 64, 128>(a, batch, max_smem, stream);
    if (kbits == 2 && vbits == 2 && group == 128) return launch_attend_t<2, 2, 128, 128>(a, batch, max_smem, stream);
    return KVARN_CUDA_ERR_ARGUMENT;
}

}  // namespace kvarn_cuda
