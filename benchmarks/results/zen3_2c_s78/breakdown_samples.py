# breakdown.py's stages from sampler.so's output instead of perf's: the sampled addresses that fall in the
# native module, each sample's function from nm, attend_tiles_impl<4, 2>'s own samples by the line of
# attend_tiles_impl they belong to (profile_lines.py).
# usage: python breakdown_samples.py SAMPLES _native.so [kernels_avx2.cpp|kernels_avx512.cpp]
import collections, re, sys

from profile_lines import IMPL, Module, impl_stages, stage_of_function

samples_path, so = sys.argv[1], sys.argv[2]
source = sys.argv[3] if len(sys.argv) > 3 else "kernels_avx2.cpp"
module = Module(samples_path, so)
counts, impl_addresses, outside = collections.Counter(), collections.Counter(), 0
for ip in module.samples:
    a = module.address(ip)
    if a is None:
        outside += 1
        continue
    name = module.function(a)
    stage = stage_of_function(name)
    if stage:
        counts[stage] += 1
    elif IMPL in name:
        impl_addresses[a] += 1
    else:
        counts["elsewhere in the module: " + re.sub(r"\(.*", "", name.replace("(anonymous namespace)", "anon"))[-60:]] += 1
counts += impl_stages(so, source, impl_addresses)
kernel = sum(n for k, n in counts.items() if not k.startswith("elsewhere"))
print(f"{len(module.samples)} samples, {outside} outside the module; shares of the kernel's {kernel}:")
for name, n in counts.most_common():
    if not name.startswith("elsewhere") or n >= 0.005 * kernel:
        print(f"{name:48s} {n:7d} {100 * n / kernel:5.1f} %")
