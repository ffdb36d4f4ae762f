"""s13: tables of the A/B logs (h200_s13_run1_ab{1,2}.log): per point and mode, each variant's readings in run order
(medians, us; in brackets the mean of the middle 80 % of the single calls for the per-call modes)."""
import re, sys, collections, statistics
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sys.argv[1:]:
    for line in open(f):
        m = re.match(r"v(\d+) ctx +(\d+) B +(\d+): (?:evict (\w+) +\d+ MB: )?kvarn +([0-9.]+) us(?:.*middle 80 % ([0-9.]+))?", line)
        if not m: continue
        v, ctx, b, kind, med, tm = m.groups()
        rows[(int(ctx), int(b), kind or "warm (graph)")][int(v)].append((float(med), float(tm) if tm else None))
order = ["warm (graph)", "none", "fill", "gemm"]
print("| point | mode | VAR 16 medians | VAR 23 medians | median of medians 16 -> 23 | trimmed means 16 -> 23 (avg) |")
print("|---|---|---|---|---|---|")
for (ctx, b, kind) in sorted(rows, key=lambda k: (k[0] * k[1], k[0], order.index(k[2]))):
    r = rows[(ctx, b, kind)]
    a, c = r[16], r[23]
    ma, mc = statistics.median(x for x, _ in a), statistics.median(x for x, _ in c)
    tm = ""
    if a[0][1] is not None:
        ta, tc = statistics.mean(y for _, y in a), statistics.mean(y for _, y in c)
        tm = f"{ta:.2f} -> {tc:.2f} ({100 * (tc / ta - 1):+.1f} %)"
    print(f"| {ctx // 1024}K x {b} | {kind} | {' '.join(f'{x:.1f}' for x, _ in a)} | {' '.join(f'{x:.1f}' for x, _ in c)} | "
          f"{ma:.1f} -> {mc:.1f} ({100 * (mc / ma - 1):+.1f} %) | {tm} |")
