"""s7: ncu warp-state samples and executed instructions per kernel stage, per SASS instruction joined
with its inline chain (how the s7 profile's stage table was made; the line ranges are those of the
call-1 build's attend.cuh, VAR 8 kernel).
  ncu --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 -o p ...
  ncu -i p.ncu-rep --page source --csv --print-source sass > sass.csv        (on the device)
  cuobjdump -xelf all attend_d128.cu.o; nvdisasm -gi -c attend_d128.sm_90a.cubin > alli.sass  (same objects)
  python h200_s7_stage_split.py alli.sass sass.csv <mangled kernel name>"""
import collections, csv, re, sys

sass_file, csv_file, fn = sys.argv[1:4]
lines = open(sass_file).read().split('\n')
start = lines.index(fn + ':')
info, pend, chain = {}, [], None
for l in lines[start + 1:]:
    if '.section' in l and info:
        break
    m = re.match(r'\s*//## File "([^"]+)", line (\d+)(.*)', l)
    if m:  # innermost line first, then "inlined at" parents (one per annotation line)
        if not pend:
            pend.append((m.group(1).split('/')[-1], int(m.group(2))))
        for mm in re.finditer(r'inlined at "([^"]+)", line (\d+)', m.group(3)):
            pend.append((mm.group(1).split('/')[-1], int(mm.group(2))))
        continue
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if m:
        if pend:
            chain = list(dict.fromkeys(pend))
            pend = []
        info[int(m.group(1), 16)] = chain
rows = list(csv.reader(open(csv_file)))
hdr = rows[1]
data = [dict(zip(hdr, r)) for r in rows[2:] if len(r) == len(hdr)]
base = int(data[0]['Address'], 16)
scols = [c for c in hdr if c.startswith('stall_') and 'Not Issued' not in c]


def stage(ch):
    a = [ln for f, ln in ch if f == 'attend.cuh']
    s = set(a)
    if 1208 in s:  # tiles_pair
        if any(f == 'common.cuh' and 72 <= ln <= 84 for f, ln in ch):
            return 'T1 tiles: mbar_wait (record)'
        t = [ln for ln in a if 809 <= ln <= 1037]
        ln = t[0] if t else 0
        return ('T7 tiles: end' if ln >= 1022 else 'T6 tiles: refill' if ln >= 1010 else
                'T2 tiles: QK prep' if ln < 880 else 'T3 tiles: QK codes+MMA' if ln < 905 else
                'T4 tiles: softmax' if ln < 955 else 'T5 tiles: P transpose' if ln < 985 else 'T5b tiles: PV + acc')
    if 1228 in s:
        return 'E1 finish_states'
    if 1229 in s:
        if s & {451, 452, 453}:
            return 'E2 cluster sync 1'
        if s & {515, 516, 517, 518}:
            return 'E4 cluster sync 2'
        t = [ln for ln in a if 443 <= ln <= 535]
        return 'E3 merge reads+combine' if (t[0] if t else 0) < 516 else 'E5 merge rotate+store'
    for ln in a:
        if 1211 <= ln <= 1226: return 'E0 sink/tail states + sync'
        if 1076 <= ln <= 1098: return 'P1 mbarriers + first copies'
        if 1100 <= ln <= 1110: return 'P2 q load'
        if 1111 <= ln <= 1142: return 'P3 q rotate'
        if 1143 <= ln <= 1204: return 'P4 sink/tail'
        if 1205 <= ln <= 1206: return 'P5 sync before tiles'
        if 1232 <= ln <= 1270: return 'K0 kernel setup'
    return 'other'


agg = collections.defaultdict(lambda: [0, 0, collections.Counter()])
for d in data:
    ch = info.get(int(d['Address'], 16) - base) or []
    k = stage(ch)
    agg[k][0] += int(d['Warp Stall Sampling (All Samples)'] or 0)
    agg[k][1] += int(d['Instructions Executed'] or 0)
    agg[k][2].update({c[6:]: int(d[c] or 0) for c in scols if int(d[c] or 0)})
tot = sum(v[0] for v in agg.values())
warps = int(data[0]['Instructions Executed'])  # the entry instruction runs once per warp
for k in sorted(agg):
    s, e, st = agg[k]
    print('%-30s %6d %5.1f%%  inst/warp %7.1f  [%s]' % (k, s, 100 * s / tot, e / warps,
                                                        ', '.join('%s %d' % kv for kv in st.most_common(3))))
