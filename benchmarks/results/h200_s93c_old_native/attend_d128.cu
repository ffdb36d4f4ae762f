// attend_kernel instances for head_dim 128 (one file per head_dim: parallel, bounded compiles).
#include <cstdlib>

#include "attend.cuh"

namespace kvarn_cuda {

int launch_attend_d128(int kbits, int vbits, int group, AttendArgs& a, int batch, int max_smem, cudaStream_t stream)
{
    if (kbits == 4 && vbits == 2 && group == 128) {
        // Served (variant 16, s8): the swapped-operand tiles (attend.cuh, tiles_swapped) where a program
        // has <= 4 query heads, else the row-split layout. Where a warp would have one record
        // (tiles_per_split <= 8) and splits <= 4: warp pairs (tiles_pair: a record shared by two warps,
        // a token half each) with twice the splits, if that runs direct in one wave, as VAR 12 (s7:
        // push_merge epilogue, q by vector loads, sink/tail scores reduced together); otherwise, at one
        // record per warp, VAR 14 (attend_early with the sink/tail share before the tiles, as VAR 5, plus
        // VAR 12's push merge and FAST prologue; s8 A/B, 4K x 1 forced to 7 splits: 15.3-15.4 -> 11.2 us),
        // and with more records per warp VAR 16 (the same with the sink/tail share after the tiles, its
        // rows loaded before them, and the stage/phase counters of NODIV; s8 A/B at 32K x 8: 79.2-79.3 ->
        // 74.6-75.6 us, 4K x 8: 27.6-27.7 -> 23.0-23.2 us), at <= 8 splits (below).
        // KVARN_ATTEND_VARIANT (read once) selects for same-run A/B timings: 12 = the s7 default (pairs as
        // VAR 12, else VAR 5 at <= 8 tiles per split, else VAR 6: the s5 tile loop with finish_states +
        // cluster_merge), 5, 6 or 14 always (no pairs; 16 is the default above, pairs included).
        static const int variant = [] {
            const char* e = std::getenv("KVARN_ATTEND_VARIANT");
            return e ? std::atoi(e) : 16;
        }();
        const int group_q = a.num_q_heads / a.c.num_kv_heads;
        if (group_q <= 4 && (variant == 5 || variant == 6 || variant == 12 || variant == 14 || variant == 16)) {
            if ((variant == 12 || variant == 16) && a.tiles_per_split <= 8 && a.splits <= 4) {
                const int rc = launch_attend_t<4, 2, 128, 128, 8, 16, 12>(a, batch, max_smem, stream, true);
                if (rc != kAttendNotLaunched) return rc;
            }
            int v = variant == 16 ? (a.tiles_per_split <= 8 ? 14 : 16)
                    : variant == 12 ? (a.tiles_per_split <= 8 ? 5 : 6) : variant;
            // VAR 16 on the direct path keeps both record stages per warp only while push_merge's receive
            // area fits beside them (up to 6 splits at GQA 4); beyond, the s5-s7 path (VAR 6) serves. VAR 6
            // also serves more than 8 splits (merge kernel): there VAR 16 measured slower (s8 A/B, 16 splits:
            // 32K x 1 31.0-31.3 -> 32.5-32.8 us, 128K x 1 53.7-53.8 -> 54.8-55.5 us; one split of 255 tiles,
            // 32K x 32, was faster: 285.3-287.1 -> 282.4-283.8 us).
            if (v == 16 && (a.splits > 8 ||
                            (a.direct && attend_smem_bytes<128, true, false, true>(8, 2, (int)a.L.total,
                                                                                    push_recv_rows(a.splits, min(8, group_q))) >
                                             (size_t)max_smem)))
                v = 6;
            if (v == 16) return launch_attend_t<4, 2, 128, 128, 8, 16, 16>(a, batch, max_smem, stream);
            if (v == 14) return launch_attend_t<4, 2, 128, 128, 8, 16, 14>(a, batch, max_smem, stream);
            if (v == 6) return launch_attend_t<4, 2, 128, 128, 8, 16, 6>(a, batch, max_smem, stream);
            return launch_attend_t<4, 2, 128, 128, 8, 16, 5>(a, batch, max_smem, stream);
        }
        return launch_attend_t<4, 2, 128, 128>(a, batch, max_smem, stream);
    }
    if (kbits == 4 && vbits == 4 && group == 128) return launch_attend_t<4, 4, 128, 128>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 2 && group == 64) return launch_attend_t<4, 2, 64, 128>(a, batch, max_smem, stream);
    if (kbits == 4 && vbits == 4 && group == 64) return launch_attend_t<4, 4, 64, 128>(a, batch, max_smem, stream);
    if (kbits == 2 && vbits == 2 && group == 128) return launch_attend_t<2, 2, 128, 128>(a, batch, max_smem, stream);
    return KVARN_CUDA_ERR_ARGUMENT;
}

}  // namespace kvarn_cuda
