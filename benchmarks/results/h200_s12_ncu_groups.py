"""s12: group an ncu source-page export (ncu --page source --csv --print-source sass, gzipped) by execution
count -- the tile loop (executed >= 10,000 times at 32K x 8) vs code run once or twice per warp -- with each
group's share of the warp-state samples and its stall reasons (% of the group's samples; no_inst also as % of all).
    python3 h200_s12_ncu_groups.py h200_s11_ncu16_32k8_sass.csv.gz h200_s12_ncu22_32k8_sass.csv.gz ..."""
import csv, gzip, collections, sys
def load(p):
    rows=list(csv.reader(gzip.open(p,"rt"))); hdr=rows[1]; data=rows[2:]
    ix={h:i for i,h in enumerate(hdr)}
    return hdr, ix, data
for p in sys.argv[1:]:
    hdr,ix,data=load(p)
    st=[h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    tot=sum(float(r[ix['Warp Stall Sampling (All Samples)']] or 0) for r in data)
    ex=[int(float(r[ix['Instructions Executed']] or 0)) for r in data]
    # hot = exec > 2048
    grp=collections.defaultdict(lambda: collections.Counter())
    for r,e in zip(data,ex):
        g = 'loop' if e>=10000 else ('once' if e>0 else 'never')
        grp[g]['samples']+=float(r[ix['Warp Stall Sampling (All Samples)']] or 0)
        grp[g]['n']+=1; grp[g]['exec']+=e
        for s in st: grp[g][s]+=float(r[ix[s]] or 0)
    allst=collections.Counter()
    for g in grp:
        for s in st: allst[s]+=grp[g][s]
    print(p.split('/')[-1], "instrs", len(data), "total samples", tot, "dyn instr", sum(ex))
    print("  all: ", {s[6:]:round(100*allst[s]/tot,1) for s in st if allst[s]/tot>0.01})
    for g in ('loop','once'):
        c=grp[g]; print(f"  {g}: n={c['n']} exec={c['exec']} samples={c['samples']} ({100*c['samples']/tot:.1f}%)", {s[6:]:round(100*c[s]/c['samples'],1) for s in st if c[s]/c['samples']>0.03}, "no_inst abs %.1f%% of all"%(100*c['stall_no_inst']/tot))
