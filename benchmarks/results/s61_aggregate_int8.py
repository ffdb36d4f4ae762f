# Twenty-first session: medians and ranges over runs of the interleaved 32K groups with a kvarn-int8 row
# (run from benchmarks/results: python s61_aggregate_int8.py 1,2,3,4,5,6,7,8,9 > zen3_2t_aggregate_s61_32k.txt).
import re, statistics as st, sys
runs = [int(x) for x in sys.argv[1].split(",")]
rows = []
for r in runs:
    t = open(f"zen3_2t_table_s61_32k_run{r}.md").read()
    cp = max(float(re.search(r"numpy-copy-1thread ([0-9.]+)", t).group(1)), float(re.search(r"torch-copy-2threads ([0-9.]+)", t).group(1)))
    for shape in ("hq32-hk8-d128", "smollm2-hq9-hk3-d64"):
        sec = t.split(f"## warm {shape} ctx=32768 batch=1")[1].split("\n## ")[0]
        warm = [l for l in sec.splitlines() if l.startswith("warm, interleaved")][0]
        i8 = [l for l in sec.splitlines() if l.startswith("int8 score mode")][0]
        k16 = float(re.search(r"kvarn ([0-9.]+) ms ->", warm).group(1)); k8 = float(re.search(r"kvarn-int8 ([0-9.]+) ms ->", i8).group(1))
        r16 = {n: float(x) for x, n in re.findall(r"([0-9.]+)x ([a-z0-9-]+) \(", warm)}
        r8 = {n: float(x) for x, n in re.findall(r"([0-9.]+)x ([a-z0-9-]+)", i8.split("->")[1])}
        mb = float(re.search(r"\| kvarn-int8-avx2-interleaved \| [0-9.]+ \| [0-9.]+ \| ([0-9.]+) \|", sec).group(1))
        rows.append((shape, k16, k8, r16["fp16"], r8["fp16"], r16["numpy"], r8["numpy"], r16["torch-folded"], r8["torch-folded"], r16["torch"], r8["torch"], 100 * mb / k16 / (cp / 2), 100 * mb / k8 / (cp / 2), k8 / k16))
names = ["kvarn ms (int16)", "kvarn ms (int8)", "vs fp16 (int16)", "vs fp16 (int8)", "vs numpy (int16)", "vs numpy (int8)", "vs folded SDPA (int16)", "vs folded SDPA (int8)", "vs SDPA gqa (int16)", "vs SDPA gqa (int8)", "% bytes-copied rate (int16)", "% bytes-copied rate (int8)", "int8 / int16 time"]
for shape in ("hq32-hk8-d128", "smollm2-hq9-hk3-d64"):
    print(f"{shape}, runs {runs}")
    R = [x for x in rows if x[0] == shape]
    for i, n in enumerate(names):
        v = [x[1 + i] for x in R]
        print(f"  {n:28s} median {st.median(v):7.3f}  range {min(v):.3f}-{max(v):.3f}   " + " ".join(f"{x:.3f}" for x in v))
