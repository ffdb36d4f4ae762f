# The samples of one function by source line (innermost and outermost line of its inline chain in SOURCE), from
# sampler.so output: python fnlines.py SAMPLES _native.so SOURCE FUNCTION-NAME-PART (profile_lines.py)
import collections, sys

from profile_lines import Module, lines_of

samples_path, so, source, pattern = sys.argv[1:5]
module = Module(samples_path, so)
addresses = collections.Counter(a for a in map(module.address, module.samples)
                                if a is not None and pattern in module.function(a))
by_line = collections.Counter()
for a, n in addresses.items():
    lines = lines_of(so, source, a)
    by_line[(str(lines[0]) if lines else "?", str(lines[-1]) if lines else "?")] += n
total = sum(by_line.values())
for (inner, outer), n in sorted(by_line.items(), key=lambda x: -x[1])[:25]:
    print(f"{100 * n / total:5.1f}% inner {inner} outer {outer}")
