// attend_kernel instances for head_dim 64 (one file per head_dim: parallel, bounded compiles).
#include "attend.cuh"

namespace kvarn_cuda {

int launch_attend_d64(int kbits, int vbits, int group, AttendArgs& a, int batch, int max_smem, cudaStream_t stream)
{
    if (kbits == 4 && vbits == 2 && group == 128) return launch_attend_t<4, 2, 128, 64>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 4 && group == 128) return launch_attend_t<4, 4, 128, 64>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 2 && group == 64) return launch_attend_t<4, 2, 64, 64>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 4 && group == 64) return launch_attend_t<4, 4, 64, 64>(a, batch, max_smem, stream);
    if (kbits == 2 && vbits == 2 && group == 128) return launch_attend_t<2, 2, 128, 64>(a, batch, max_smem, stream);
    return KVARN_CUDA_ERR_ARGUMENT;
}

}  // namespace kvarn_cuda
