// attend_kernel instances for head_dim 128 (one file per head_dim: parallel, bounded compiles).
#include <cstdlib>

#include "attend.cuh"

namespace kvarn_cuda {

int launch_attend_d128(int kbits, int vbits, int group, AttendArgs& a, int batch, int max_smem, cudaStream_t stream)
{
    if (kbits == 4 && vbits == 2 && group == 128) {
        // Served (variant 7): the swapped-operand tiles (attend.cuh, tiles_swapped) where a program
        // has <= 4 query heads, else the row-split layout; with the early sink/tail prologue (VAR 5,
        // attend_early) when no warp has more than one record (tiles_per_split <= 8 warps), else the
        // usual order (VAR 6). Early is slower once a warp streams several records: its sink/tail
        // loads then queue behind the record copies (s5 A/B: 4K x 8 +2 us, 128K x 8 +5 us), while
        // at one record per warp it hides their latency. Both take the direct path (cluster merge)
        // where splits <= 8. KVARN_ATTEND_VARIANT (read once) selects for same-run A/B timings:
        // 5 or 6 always, 4 = 6 without the direct path (the kernel before s5), 0 the kernel before
        // the swapped tiles, 1 the row-split layout everywhere.
        static const int variant = [] {
            const char* e = std::getenv("KVARN_ATTEND_VARIANT");
            return e ? std::atoi(e) : 7;
        }();
        const int group_q = a.num_q_heads / a.c.num_kv_heads;
        if (group_q <= 4 && variant >= 4) {
            const int v = variant == 7 ? (a.tiles_per_split <= 8 ? 5 : 6) : variant;
            if (v == 5) return launch_attend_t<4, 2, 128, 128, 8, 16, 5>(a, batch, max_smem, stream);
            if (v == 6) return launch_attend_t<4, 2, 128, 128, 8, 16, 6>(a, batch, max_smem, stream);
            if (v == 4) return launch_attend_t<4, 2, 128, 128, 8, 16, 4>(a, batch, max_smem, stream);
        }
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
