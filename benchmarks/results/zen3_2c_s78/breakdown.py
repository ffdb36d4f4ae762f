# Where a record's time goes, by sampling (perf record -e cpu-clock): the samples in the int16 score and value
# loops' functions (and avx512's weights_heads where it is not inlined), and attend_tiles_impl<4, 2>'s own samples
# by the line of attend_tiles_impl that the sampled instruction belongs to or is inlined into (addr2line -i, a -g
# build; profile_lines.py).
# usage: python breakdown.py perf.data _native.so [kernels_avx2.cpp|kernels_avx512.cpp]
import collections, subprocess, sys

from profile_lines import IMPL, impl_address, impl_stages, stage_of_function

data, so = sys.argv[1], sys.argv[2]
source = sys.argv[3] if len(sys.argv) > 3 else "kernels_avx2.cpp"
impl = impl_address(so, source)
counts, impl_addresses = collections.Counter(), collections.Counter()
for line in subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,symoff"], capture_output=True,
                           text=True).stdout.splitlines():
    stage = stage_of_function(line)
    if stage:
        counts[stage] += 1
    elif IMPL in line:
        impl_addresses[impl + int(line.rsplit("+0x", 1)[1], 16)] += 1
counts += impl_stages(so, source, impl_addresses)
total = sum(counts.values())
for name, n in counts.most_common():
    print(f"{name:40s} {n:7d} {100 * n / total:5.1f} %")
