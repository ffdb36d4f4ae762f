# breakdown.py's stages from sampler.so's output instead of perf's: the sampled addresses that fall in the
# native module, mapped to its link-time addresses (/proc/self/maps, readelf's LOAD segments), each sample's
# function from nm, attend_tiles_impl<4, 2>'s own samples by the line of attend_tiles_impl they belong to.
# usage: python breakdown_samples.py SAMPLES _native.so [kernels_avx2.cpp|kernels_avx512.cpp]
import bisect, collections, os, re, subprocess, sys
samples_path, so = sys.argv[1], os.path.realpath(sys.argv[2])
source = sys.argv[3] if len(sys.argv) > 3 else "kernels_avx2.cpp"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from breakdown import STAGES_BY_FILE  # noqa: E402
STAGES = STAGES_BY_FILE[source]

maps = []  # (start, end, file offset) of the module's mappings
for line in open(samples_path + ".maps"):
    parts = line.split()
    if len(parts) >= 6 and os.path.basename(parts[5]) == os.path.basename(so):  # the module may have moved since
        start, end = (int(x, 16) for x in parts[0].split("-"))
        maps.append((start, end, int(parts[2], 16)))
segments = []  # (file offset, size, vaddr) of the LOAD segments
for line in subprocess.run(["readelf", "-lW", so], capture_output=True, text=True).stdout.splitlines():
    if line.strip().startswith("LOAD"):
        f = line.split()
        segments.append((int(f[1], 16), int(f[4], 16), int(f[2], 16)))
symbols = []  # (address, size, demangled name)
for line in subprocess.run(["nm", "-C", "-S", "--defined-only", so], capture_output=True, text=True).stdout.splitlines():
    m = re.match(r"([0-9a-f]+) ([0-9a-f]+) [tTwW] (.*)", line)
    if m: symbols.append((int(m[1], 16), int(m[2], 16), m[3]))
symbols.sort()
starts = [s[0] for s in symbols]


def vaddr(ip):
    for start, end, off in maps:
        if start <= ip < end:
            file_off = ip - start + off
            for seg_off, size, seg_vaddr in segments:
                if seg_off <= file_off < seg_off + size:
                    return file_off - seg_off + seg_vaddr
    return None


def lines_of(address):
    out = subprocess.run(["addr2line", "-i", "-e", so, hex(address)], capture_output=True, text=True).stdout
    return [int(m) for m in re.findall(re.escape(source) + r":(\d+)", out)]


counts, impl_addresses, outside = collections.Counter(), collections.Counter(), 0
total_samples = 0
for line in open(samples_path):
    total_samples += 1
    a = vaddr(int(line, 16))
    if a is None:
        outside += 1
        continue
    i = bisect.bisect_right(starts, a) - 1
    name = symbols[i][2] if i >= 0 and a < symbols[i][0] + max(symbols[i][1], 1) else "?"
    # the loops' own functions, or the dispatch lambdas they are inlined into (GCC 12 here, 13 on the Xeon differ)
    if "scores_int16_dispatch" in name or "tile_scores_k4_int16" in name: counts["score loop"] += 1
    elif any(f in name for f in ("values_v2_int16_dispatch", "tile_values_v2_int16", "values_chunk_v2_int16")): counts["value loop"] += 1
    elif "weights_heads" in name: counts["weights (exp, p va, int16 rounding)"] += 1
    elif "attend_tiles_impl<4, 2>" in name: impl_addresses[a] += 1
    else: counts["elsewhere in the module: " + re.sub(r"\(.*", "", name.replace("(anonymous namespace)", "anon"))[-60:]] += 1
for a, n in impl_addresses.items():
    lines = lines_of(a)
    outer = lines[-1] if lines else 0
    counts[next((s for lo, hi, s in STAGES if lo <= outer <= hi), "other lines of attend_tiles_impl")] += n
kernel = sum(n for k, n in counts.items() if not k.startswith("elsewhere"))
print(f"{total_samples} samples, {outside} outside the module; shares of the kernel's {kernel}:")
for name, n in counts.most_common():
    if not name.startswith("elsewhere") or n >= 0.005 * kernel:
        print(f"{name:48s} {n:7d} {100 * n / kernel:5.1f} %")
