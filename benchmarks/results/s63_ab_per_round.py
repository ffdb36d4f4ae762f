# Twenty-third session: s62_dispatch_ab.py printed a ratio of medians over rounds; this prints the median of the
# per-round ratios (each round times both builds back to back), the statistic aggregate_tables.py uses.
# Run from benchmarks/results: python s63_ab_per_round.py zen3_s62_dispatch_ab.log h200_s62/dispatch_ab.log
import re, statistics, sys

for path in sys.argv[1:]:
    rounds = {}
    for m in re.finditer(r"^round (\d+) (before|after)\s+(.*)$", open(path).read(), re.M):
        rounds.setdefault(int(m.group(1)), {})[m.group(2)] = {k: float(v) for k, v in re.findall(r"(\S+)=([0-9.]+)", m.group(3))}
    keys = list(next(iter(rounds.values()))["before"])
    print(path)
    for k in keys:
        r = [x["after"][k] / x["before"][k] for x in rounds.values()]
        print(f"  {k:14s} after / before per round: median {statistics.median(r):.3f} (range {min(r):.3f}-{max(r):.3f})")
