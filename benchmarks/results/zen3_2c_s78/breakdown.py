# Where a record's time goes, by sampling (perf record -e cpu-clock): the samples in the int16 score and value
# loops' functions (and avx512's weights_heads where it is not inlined), and attend_tiles_impl<4, 2>'s own samples
# by the line of attend_tiles_impl that the sampled instruction belongs to or is inlined into (addr2line -i, a -g
# build). Line ranges for 7dd1212's kernels_avx2.cpp / kernels_avx512.cpp.
# usage: python breakdown.py perf.data _native.so [kernels_avx2.cpp|kernels_avx512.cpp]
import collections, re, subprocess, sys
data, so = sys.argv[1], sys.argv[2]
source = sys.argv[3] if len(sys.argv) > 3 else "kernels_avx2.cpp"
STAGES_BY_FILE = {
    "kernels_avx2.cpp": [(852, 867, "fp16 scale vectors"), (868, 904, "query prep (q ka, int16 rounding)"),
                         (905, 932, "scores: call, rescale"), (933, 961, "weights (exp, p va, int16 rounding)"),
                         (962, 971, "values: call"), (972, 979, "accumulation")],
    "kernels_avx512.cpp": [(841, 857, "fp16 scale vectors"), (858, 890, "query prep (q ka, int16 rounding)"),
                           (891, 912, "scores: call"), (913, 923, "weights (exp, p va, int16 rounding)"),
                           (924, 933, "values: call"), (934, 942, "accumulation")],
}
STAGES = STAGES_BY_FILE[source]


def lines_of(address):
    out = subprocess.run(["addr2line", "-i", "-e", so, hex(address)], capture_output=True, text=True).stdout
    return [int(m) for m in re.findall(re.escape(source) + r":(\d+)", out)]


if __name__ == "__main__":
    # the attend_tiles_impl<4, 2> of this file (each ISA's file has one, under the same name)
    impl = next(a for a in (int(l.split()[0], 16) for l in subprocess.run(["nm", "-C", so], capture_output=True,
                text=True).stdout.splitlines() if "attend_tiles_impl<4, 2>" in l) if lines_of(a + 16))
    counts, offsets = collections.Counter(), collections.Counter()
    for line in subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,symoff"], capture_output=True,
                               text=True).stdout.splitlines():
        if "scores_int16_dispatch" in line: counts["score loop"] += 1
        elif "values_v2_int16_dispatch" in line: counts["value loop"] += 1
        elif "weights_heads" in line: counts["weights (exp, p va, int16 rounding)"] += 1
        elif "attend_tiles_impl<4, 2>" in line: offsets[int(line.rsplit("+0x", 1)[1], 16)] += 1
    for off, n in offsets.items():
        lines = lines_of(impl + off)
        outer = lines[-1] if lines else 0
        counts[next((name for lo, hi, name in STAGES if lo <= outer <= hi), "other lines of attend_tiles_impl")] += n
    total = sum(counts.values())
    for name, n in counts.most_common():
        print(f"{name:40s} {n:7d} {100 * n / total:5.1f} %")
