// attend_kernel instances for head_dim 128 (one file per head_dim: parallel, bounded compiles).
#include <cstdlib>

#include "attend.cuh"

namespace kvarn_cuda {

int launch_attend_d128(int kbits, int vbits, int group, AttendArgs& a, int batch, int max_smem, cudaStream_t stream)
{
    if (kbits == 4 && vbits == 2 && group == 128) {
        // Served (variant 12, s7): the swapped-operand tiles (attend.cuh, tiles_swapped) where a program
        // has <= 4 query heads, else the row-split layout. Where a warp would have one record
        // (tiles_per_split <= 8) and splits <= 4: warp pairs (tiles_pair: a record shared by two warps,
        // a token half each) with twice the splits, if that runs direct in one wave (s6 A/B, 4K x 1:
        // 16.1-16.3 -> 13.4 us), as VAR 12 = VAR 8 + push_merge (the warp combine vectorised and pushed
        // into the head owner's shared memory: one cluster barrier, no DSMEM reads) + q by vector loads
        // and the sink/tail scores reduced together; otherwise the early sink/tail prologue (VAR 5) at
        // one record per warp, else the usual order (VAR 6). Early is slower once a warp streams several
        // records: its sink/tail loads then queue behind the record copies (s5 A/B: 4K x 8 +2 us,
        // 128K x 8 +5 us). All take the direct path (cluster merge) where splits <= 8.
        // KVARN_ATTEND_VARIANT (read once) selects for same-run A/B timings: 9 = the s6 default (VAR 8
        // kernel for the pairs), 11 = VAR 11 (push_merge only), 7 = the s5 default (5 or 6, no pairs),
        // 8 = pairs (VAR 8) everywhere on the plan's splits (tests), 5 or 6 always, 4 = 6 without the
        // direct path (the kernel before s5), 0 the kernel before the swapped tiles, 1 the row-split layout.
        static const int variant = [] {
            const char* e = std::getenv("KVARN_ATTEND_VARIANT");
            return e ? std::atoi(e) : 12;
        }();
        const int group_q = a.num_q_heads / a.c.num_kv_heads;
        if (group_q <= 4 && variant >= 4) {
            if (variant == 8) return launch_attend_t<4, 2, 128, 128, 8, 16, 8>(a, batch, max_smem, stream);
            if ((variant == 9 || variant == 11 || variant == 12) && a.tiles_per_split <= 8 && a.splits <= 4) {
                const int rc = variant == 11 ? launch_attend_t<4, 2, 128, 128, 8, 16, 11>(a, batch, max_smem, stream, true)
                               : variant == 12 ? launch_attend_t<4, 2, 128, 128, 8, 16, 12>(a, batch, max_smem, stream, true)
                                               : launch_attend_t<4, 2, 128, 128, 8, 16, 8>(a, batch, max_smem, stream, true);
                if (rc != kAttendNotLaunched) return rc;
            }
            const int v = variant >= 7 ? (a.tiles_per_split <= 8 ? 5 : 6) : variant;
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
