# Shares of kvarn's decode-kernel samples by function (perf report --sort sym), one perf.data per argument:
# the score loop, the value loop, the weights (a function of its own in the avx512 build; inlined into
# attend_tiles_impl in the avx2 one) and attend_tiles_impl's own lines (fp16 scale vectors, query prep,
# accumulation; and avx2's weights). Function names, not line ranges, so it holds for any revision.
import subprocess, sys

STAGES = [("score loop", ("scores_int16_dispatch", "tile_scores_k4_int16")),
          ("value loop", ("values_v2_int16_dispatch", "values_chunk_v2_int16", "tile_values_v2_int16")),
          ("weights", ("weights_heads",)),
          ("attend_tiles_impl's own", ("attend_tiles_impl",))]
for data in sys.argv[1:]:
    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "sym"], capture_output=True,
                         text=True).stdout
    shares = dict.fromkeys([s for s, _ in STAGES], 0.0)
    for line in out.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pct = float(line.split("%")[0])
        for stage, names in STAGES:
            if any(n in line for n in names):
                shares[stage] += pct
                break
    total = sum(shares.values())
    print(f"{data}: kvarn kernel {total:.1f} % of all samples; of it " +
          ", ".join(f"{s} {100 * v / total:.1f} %" for s, v in shares.items()))
