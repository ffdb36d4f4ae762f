# Shares of kvarn's decode-kernel samples by function (perf report --sort sym), one perf.data per argument:
# the score loop, the value loop, the weights (a function of its own in the avx512 build; inlined into
# attend_tiles_impl in the avx2 one) and attend_tiles_impl's own lines (fp16 scale vectors, query prep,
# accumulation; and avx2's weights). By function name (the thirty-eighth session's stage_of_function), not by
# line ranges, so it holds for any revision.
import pathlib, subprocess, sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "zen3_2c_s78"))
from profile_lines import IMPL, stage_of_function  # noqa: E402

OWN = "attend_tiles_impl's own"
for data in sys.argv[1:]:
    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "sym"], capture_output=True,
                         text=True).stdout
    shares = {}
    for line in out.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        stage = stage_of_function(line) or (OWN if IMPL in line else None)
        if stage:
            shares[stage] = shares.get(stage, 0.0) + float(line.split("%")[0])
    total = sum(shares.values())
    print(f"{data}: kvarn kernel {total:.1f} % of all samples; of it " +
          ", ".join(f"{s} {100 * v / total:.1f} %" for s, v in sorted(shares.items(), key=lambda x: -x[1])))
