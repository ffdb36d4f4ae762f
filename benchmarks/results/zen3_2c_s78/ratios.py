# new / old per-record time per round and shape from an ab*_1t.log (lines "rN SHAPE old|new: ... X us per record").
import collections, re, statistics, sys
for path in sys.argv[1:]:
    t = collections.defaultdict(dict)
    for line in open(path):
        m = re.match(r"(r\d+) (\S+) (old|new): .* ([\d.]+) us per record", line)
        if m: t[(m[1], m[2])][m[3]] = float(m[4])
    by_shape = collections.defaultdict(list)
    for (r, shape), v in t.items():
        if "old" in v and "new" in v: by_shape[shape].append(v["new"] / v["old"])
    for shape, rs in by_shape.items():
        print(f"{path} {shape}: median {statistics.median(rs):.3f} ({min(rs):.3f}-{max(rs):.3f}, {len(rs)} pairs)")
