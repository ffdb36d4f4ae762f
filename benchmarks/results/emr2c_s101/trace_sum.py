"""Summary of a traced run (python trace_sum.py STDERR_FILE): the scratch build printed one TRACE line per call."""
import re, sys
lines=[l for l in open(sys.argv[1]) if l.startswith('TRACE')]
rows=[]
for l in lines[50:]:
    tot=int(l.split()[2]); its=[tuple(map(int,x)) for x in re.findall(r'\[(\d+) (\d+)-(\d+)\]', l)]
    rows.append((tot,its))
rows.sort(key=lambda r:r[0])
for tot,its in rows[:2]+rows[len(rows)//2:len(rows)//2+1]:
    by={}
    for t,b,e in its: by.setdefault(t,[]).append((b,e))
    s=f"total {tot/1e3:.1f}us "
    for t in sorted(by):
        L=sorted(by[t]); busy=sum(e-b for b,e in L)
        s+=f"| tid{t}: n={len(L)} start {L[0][0]/1e3:.1f} end {L[-1][1]/1e3:.1f} busy {busy/1e3:.1f} items {' '.join(f'{(e-b)/1e3:.1f}' for b,e in L)} "
    print(s)
