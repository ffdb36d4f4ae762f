# Where a record's time goes, by sampling (perf record -e cpu-clock; this VM has no hardware counters): the samples
# in the avx2 int16 score and value loops' functions, and attend_tiles_impl<4, 2>'s own samples by the line of
# attend_tiles_impl that the sampled instruction belongs to or is inlined into (addr2line -i, a -g build).
# usage: python breakdown.py perf.data _native.so  (line ranges for kernels_avx2.cpp at 7dd1212)
import collections, re, subprocess, sys
data, so = sys.argv[1], sys.argv[2]
impl = next(int(l.split()[0], 16) for l in subprocess.run(["nm", "-C", so], capture_output=True, text=True).stdout.splitlines()
            if "attend_tiles_impl<4, 2>" in l)  # the avx2 file's instantiation comes first
STAGES = [(852, 867, "fp16 scale vectors"), (868, 904, "query prep (q ka, int16 rounding)"),
          (905, 932, "scores: call, rescale"), (933, 961, "weights (exp, p va, int16 rounding)"),
          (962, 971, "values: call"), (972, 979, "accumulation")]
counts, offsets = collections.Counter(), collections.Counter()
for line in subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,symoff"], capture_output=True, text=True).stdout.splitlines():
    if "scores_int16_dispatch" in line: counts["score loop"] += 1
    elif "values_v2_int16_dispatch" in line: counts["value loop"] += 1
    elif "attend_tiles_impl<4, 2>" in line: offsets[int(line.rsplit("+0x", 1)[1], 16)] += 1
for off, n in offsets.items():
    out = subprocess.run(["addr2line", "-i", "-e", so, hex(impl + off)], capture_output=True, text=True).stdout
    lines = [int(m) for m in re.findall(r"kernels_avx2\.cpp:(\d+)", out)]
    outer = lines[-1] if lines else 0
    counts[next((name for lo, hi, name in STAGES if lo <= outer <= hi), "other lines of attend_tiles_impl")] += n
total = sum(counts.values())
for name, n in counts.most_common():
    print(f"{name:40s} {n:7d} {100 * n / total:5.1f} %")
