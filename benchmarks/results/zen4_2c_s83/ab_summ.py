# Forty-third session: per-(ISA, threads, shape) medians over rounds of B / A per-call ratios from an ab_*.log.
import re, sys, collections, statistics as st
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r"r(\d+) (\S+) th(\d+) (\S+) (\S+): .*cold kvarn min ([\d.]+) med ([\d.]+) \| fp16 min ([\d.]+).*warm kvarn min ([\d.]+)", line)
    if not m: continue
    r, isa, th, shape, b = m.group(1, 2, 3, 4, 5)
    rows[(isa, th, shape)][b].append((int(r), float(m.group(6)), float(m.group(7)), float(m.group(8)), float(m.group(9))))
for key, bs in rows.items():
    names = list(bs)
    a, b = bs[names[0]], bs[names[1]]
    cold = [y[1] / x[1] for x, y in zip(a, b)]; coldmed = [y[2] / x[2] for x, y in zip(a, b)]; warm = [y[4] / x[4] for x, y in zip(a, b)]
    fr_a = [x[3] / x[1] for x in a]; fr_b = [y[3] / y[1] for y in b]
    print(f"{key}: {names[1]}/{names[0]} cold-min ratio med {st.median(cold):.3f} [{min(cold):.3f}-{max(cold):.3f}] cold-median {st.median(coldmed):.3f} "
          f"warm-min {st.median(warm):.3f} | x fp16 cold {names[0]} {st.median(fr_a):.2f} {names[1]} {st.median(fr_b):.2f}")
