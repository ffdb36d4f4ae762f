"""The twelve 32K b1 runs of standing/ and standing2/ together (each dir's summary.txt, written by
../zen4_2c_s82/summarise.py avx512 1 6): range, median and how many runs reach #3's target, per ratio."""
import re
import statistics as st

TARGETS = {"x fp16": 2, "int8 x fp16": 2, "cold x fp16": 2, "x folded": 10, "int8 x folded": 10, "x numpy": 10,
           "x gqa": 10, "% bytes-copied rate": 50}
rows = {}
for d in ("standing", "standing2"):
    shape = None
    for line in open(f"{d}/summary.txt"):
        if not line.startswith(" "):
            shape = line.strip()
            continue
        m = re.match(r"\s+(.*?)\s{2,}.*\[(.*)\]", line)
        if m:
            rows.setdefault((shape, m.group(1)), []).extend(float(x) for x in m.group(2).split(","))
for (shape, name), xs in rows.items():
    if name in TARGETS or name in ("kvarn ms", "copy r+w GB/s"):
        reach = f"{sum(x >= TARGETS[name] for x in xs)}/{len(xs)} reach {TARGETS[name]}" if name in TARGETS else ""
        print(f"{shape:22s} {name:20s} {min(xs):.2f}-{max(xs):.2f} median {st.median(xs):.2f}  {reach}")
