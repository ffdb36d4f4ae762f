# Twenty-third session (a report-only audit's point): the warm interleaved groups' ratios from minima take each
# implementation's minimum over a different number of calls (its blocks hold ~50 ms of calls: ~14 for kvarn at
# 32K b1, 3 for numpy); the same series' medians, as a check. Reads the committed per-run tables.
# Run from benchmarks/results: python s63_warm_median_ratios.py zen3_2t_table_s55_run{1,2,3}.md zen3_2t_table_s55_32k_run{1,2,3}.md
import re, statistics, sys

GROUP = "## warm hq32-hk8-d128 ctx=32768 batch=1"
for path in sys.argv[1:]:
    text = open(path).read()
    if GROUP not in text:
        continue
    block = text.split(GROUP, 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^\| (\S+)-interleaved \| ([0-9.]+) \| ([0-9.]+) \|", block, re.M)}
    kv = next(v for k, v in rows.items() if k.startswith("kvarn-") and "int8" not in k)
    f16 = next(v for k, v in rows.items() if k.startswith("fp16-"))
    print(f"{path}: fp16 / kvarn  minima {f16[0] / kv[0]:.2f}x  medians {f16[1] / kv[1]:.2f}x  "
          f"numpy minima {rows['numpy'][0] / kv[0]:.2f}x medians {rows['numpy'][1] / kv[1]:.2f}x")
