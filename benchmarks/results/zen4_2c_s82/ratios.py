"""new / old per-record time (best of N calls) per round of ab.sh's log (either order within a pair); median and
range per row.    python ratios.py ab_1t.log"""
import re
import statistics
import sys
from collections import defaultdict

times = defaultdict(dict)  # (isa, mode, shape) -> {(round, build): us}
for line in open(sys.argv[1]):
    m = re.match(r"r(\d+) (old|new): (\S+) (\S+) (\S+) threads \d+: .* ([\d.]+) us per record", line)
    if m:
        r, build, isa, mode, shape, us = m.groups()
        times[isa, mode, shape][r, build] = float(us)
for (isa, mode, shape), t in times.items():
    v = [t[r, "new"] / t[r, "old"] for r in sorted({r for r, _ in t}) if (r, "new") in t and (r, "old") in t]
    print(f"{isa:6} {mode:5} {shape:9} new/old median {statistics.median(v):.3f} (range {min(v):.3f}-{max(v):.3f}, {len(v)} pairs)")
