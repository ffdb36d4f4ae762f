# The samples of one function by source line (innermost and outermost frame in SOURCE, addr2line -i), from
# sampler.so output: python fnlines.py SAMPLES _native.so SOURCE FUNCTION-NAME-PART (see breakdown_samples.py)
import bisect, collections, os, re, subprocess, sys

samples_path, so, source, pattern = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
maps = []
for line in open(samples_path + ".maps"):
    p = line.split()
    if len(p) >= 6 and os.path.basename(p[5]) == os.path.basename(so):
        s, e = (int(x, 16) for x in p[0].split("-")); maps.append((s, e, int(p[2], 16)))
segs = []
for line in subprocess.run(["readelf", "-lW", so], capture_output=True, text=True).stdout.splitlines():
    if line.strip().startswith("LOAD"):
        f = line.split(); segs.append((int(f[1], 16), int(f[4], 16), int(f[2], 16)))
syms = []
for line in subprocess.run(["nm", "-C", "-S", "--defined-only", so], capture_output=True, text=True).stdout.splitlines():
    m = re.match(r"([0-9a-f]+) ([0-9a-f]+) [tTwW] (.*)", line)
    if m: syms.append((int(m[1], 16), int(m[2], 16), m[3]))
syms.sort(); starts = [x[0] for x in syms]
def va(ip):
    for s, e, o in maps:
        if s <= ip < e:
            fo = ip - s + o
            for so_, sz, v in segs:
                if so_ <= fo < so_ + sz: return fo - so_ + v
addrs = collections.Counter()
for line in open(samples_path):
    a = va(int(line, 16))
    if a is None: continue
    i = bisect.bisect_right(starts, a) - 1
    if i >= 0 and pattern in syms[i][2]: addrs[a] += 1
lines = collections.Counter()
for a, n in addrs.items():
    out = subprocess.run(["addr2line", "-i", "-e", so, hex(a)], capture_output=True, text=True).stdout
    ls = re.findall(re.escape(source) + r":(\d+)", out)
    lines[(ls[0] if ls else "?", ls[-1] if ls else "?")] += n
tot = sum(lines.values())
for k, n in sorted(lines.items(), key=lambda x: -x[1])[:25]: print(f"{100*n/tot:5.1f}% inner {k[0]} outer {k[1]}")
