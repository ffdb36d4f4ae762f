# zen3_2c_s77/summarise.py for any ISA's rows: per-run figures of the 32K b1 target rows (t32k_run*.md), their ranges
# and medians.    python3 summarise.py ISA FIRST LAST
import re
import statistics
import sys

isa, runs = sys.argv[1], range(int(sys.argv[2]), int(sys.argv[3]) + 1)
for shape in ['hq32-hk8-d128', 'smollm2-hq9-hk3-d64']:
    rows = []
    for r in runs:
        t = open(f't32k_run{r}.md').read()
        copy = max(float(x) for x in re.findall(r" ([0-9.]+)(?=,|\s*$)", t.split('\n')[0]))
        blk = t.split(f'## warm {shape} ctx=32768 batch=1')[1].split('\n## ')[0]
        k = float(re.search(rf'\| kvarn-{isa}-interleaved \| ([\d.]+) \|', blk)[1])
        k8 = float(re.search(rf'\| kvarn-int8-{isa}-interleaved \| ([\d.]+) \|', blk)[1])
        mb = float(re.search(rf'\| kvarn-{isa}-interleaved \| [\d.]+ \| [\d.]+ \| ([\d.]+)', blk)[1])
        w = re.search(r'-> ([\d.]+)x fp16 .*?, ([\d.]+)x numpy .*?, ([\d.]+)x torch-folded .*?, ([\d.]+)x torch', blk)
        i8 = re.search(r'kvarn-int8 [\d.]+ ms -> ([\d.]+)x fp16, ([\d.]+)x numpy, ([\d.]+)x torch-folded, ([\d.]+)x torch', blk)
        c = re.search(r'-> kvarn ([\d.]+)x faster', t.split(f'## cold {shape}')[1])
        rows.append((k, *map(float, w.groups()), k8, *map(float, i8.groups()), float(c[1]),
                     100 * mb / k / (copy / 2), 100 * mb / k8 / (copy / 2), copy))
    print(shape)
    names = ['kvarn ms', 'x fp16', 'x numpy', 'x folded', 'x gqa', 'int8 ms', 'int8 x fp16', 'int8 x numpy',
             'int8 x folded', 'int8 x gqa',
             'cold x fp16', '% bytes-copied rate', 'int8 %', 'copy r+w GB/s']
    for i, n in enumerate(names):
        v = [x[i] for x in rows]
        print(f'  {n:20s} {min(v):.2f}-{max(v):.2f} median {statistics.median(v):.2f}', [round(x, 2) for x in v])
