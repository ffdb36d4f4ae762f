// attend_kernel instances for head_dim 128 (one file per head_dim: parallel, bounded compiles).
#include <cstdlib>

#include "attend.cuh"

namespace kvarn_cuda {

int launch_attend_d128(int kbits, int vbits, int group, const AttendArgs& a, int batch, int max_smem, cudaStream_t stream)
{
    if (kbits == 4 && vbits == 2 && group == 128) {
        // Served: the swapped-operand tiles (attend.cuh, tiles_swapped) where a program has <= 4 query
        // heads, else the row-split layout. KVARN_ATTEND_VARIANT (read once) selects for same-run A/B
        // timings: 0 the kernel before these changes, 1 the row-split layout everywhere.
        static const int variant = [] {
            const char* e = std::getenv("KVARN_ATTEND_VARIANT");
            return e ? std::atoi(e) : 4;
        }();
        const int group_q = a.num_q_heads / a.c.num_kv_heads;
        if (variant == 4 && group_q <= 4) return launch_attend_t<4, 2, 128, 128, 8, 16, 4>(a, batch, max_smem, stream);
        if (variant == 0) return launch_attend_t<4, 2, 128, 128, 8, 16, 0>(a, batch, max_smem, stream);
        return launch_attend_t<4, 2, 128, 128>(a, batch, max_smem, stream);
    }
    if (kbits == 4 && vbits == 4 && group == 128) return launch_attend_t<4, 4, 128, 128>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 2 && group == 64) return launch_attend_t<4, 2, 64, 128>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 4 && group == 64) return launch_attend_t<4, 4, 64, 128>(a, batch, max_smem, stream);
    if (kbits == 2 && vbits == 2 && group == 128) return launch_attend_t<2, 2, 128, 128>(a, batch, max_smem, stream);
    return KVARN_CUDA_ERR_ARGUMENT;
}

}  // namespace kvarn_cuda
