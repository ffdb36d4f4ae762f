"""Medians over several runs of the CPU benchmarks' summary tables (KVARN_BENCH_TABLE files).

This shared host is noisy: one run can put a row in a slow spell. Per point: the median over runs of
each row's minimum (times), and every ratio as the median over runs of that run's ratio, with the
range (a ratio of two medians could pair times from different runs; until 2026-12-01 the warm
columns were such ratios). Warm interleaved groups (test_decode_warm_interleaved): the median and
range of each run's interleaved ratios.

    python benchmarks/aggregate_tables.py results/epyc_2t_table_s3_run1.md results/..._run2.md ...

Prints markdown rows: warm attention groups, cold decode steps, quantise shares, quantiser groups.
"""
import re
import statistics
import sys


def parse(text):
    """-> (copy GB/s or None, {group: (rows {impl: (min_ms, MB)}, notes {kind: tuple})})"""
    first = text.split("\n")[0]  # "copy bandwidth (...): impl GB/s, impl GB/s": the floor is the fastest copy
    rates = re.findall(r" ([0-9.]+)(?=,|\s*$)", first) if first.startswith("copy bandwidth") else []
    copy = max(float(x) for x in rates) if rates else None
    groups = {}
    for block in text.split("\n## ")[1:]:
        lines = block.strip().split("\n")
        rows, notes = {}, {}
        for line in lines[3:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if line.startswith("|") and len(cells) >= 9:
                rows[cells[0]] = (float(cells[1]), float(cells[3]))
            m = re.search(r"\((\d+) layer copies.*kvarn ([0-9.]+) ms, fp16 ([0-9.]+) ms.*?([0-9.]+)x faster", line)
            if m:
                notes["cold"] = (int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4)))
            m = re.search(r"= ([0-9.]+)% of a ([0-9.]+) ms", line)
            if m:
                notes["share"] = (float(m.group(1)), float(m.group(2)))
            if line.startswith("warm, interleaved"):
                kv = re.search(r"kvarn ([0-9.]+) ms", line)
                pairs = re.findall(r"([0-9.]+)x ([a-z0-9-]+) \(([0-9.]+) ms\)", line)
                notes["warm"] = (float(kv.group(1)), {name: float(r) for r, name, _ in pairs})
        groups[lines[0]] = (rows, notes)
    return copy, groups


def fmt(x):
    return "–" if x is None else f"{x:.3f}"


def main(paths):
    runs = [parse(open(p).read()) for p in paths]
    median = statistics.median
    print("copy bandwidth (read + write GB/s) per run:", [r[0] for r in runs])
    for group in runs[0][1]:
        present = [r[1][group] for r in runs if group in r[1]]
        if group.startswith("attend "):
            impls = present[0][0]
            mins = {k: median(p[0][k][0] for p in present if k in p[0]) for k in impls}
            fp16 = min(v for k, v in mins.items() if k.startswith("fp16"))
            key = next(k for k in ("kvarn-avx512-int16", "kvarn-avx2-int16", "kvarn-avx512-float", "kvarn-scalar")
                       if k in mins)  # the default row
            best = mins[key]
            per_run = [min(v[0] for k, v in p[0].items() if k.startswith("fp16")) / p[0][key][0] for p in present]
            gbps = impls[key][1] / best  # MB / ms

            def ratio(k):  # median over runs of that run's ratio, and the range
                runs_k = [p[0][k][0] / p[0][key][0] for p in present if k in p[0]]
                return f"{median(runs_k):.1f}x ({min(runs_k):.1f}–{max(runs_k):.1f})" if runs_k else "–"

            # what an AVX2-only CPU gets: its default (int16) against the fp16 kernel of the same ISA
            a2, f2 = "kvarn-avx2-int16", "fp16-avx2"
            a2_runs = [p[0][f2][0] / p[0][a2][0] for p in present if a2 in p[0] and f2 in p[0]]
            a2_cell = f"{median(a2_runs):.2f}x ({min(a2_runs):.2f}–{max(a2_runs):.2f})" if a2_runs else "–"
            print(f"| {group[7:]} | {best:.3f} | {fmt(mins.get('kvarn-avx512-float'))} | {fmt(mins.get(a2))} | "
                  f"{fmt(mins.get('kvarn-avx2-float'))} | {fp16:.3f} | {fmt(mins.get(f2))} | {fmt(mins.get('numpy'))} | "
                  f"{fmt(mins.get('torch'))} | **{median(per_run):.2f}x** ({min(per_run):.2f}–{max(per_run):.2f}) | "
                  f"{ratio('numpy')} | {ratio('torch')} | {gbps:.1f} | {a2_cell} |")
        elif group.startswith("warm "):
            warm = [p[1]["warm"] for p in present if "warm" in p[1]]
            names = list(warm[0][1])
            cells = []
            for name in names:
                r = [w[1][name] for w in warm if name in w[1]]
                cells.append(f"**{median(r):.2f}x** ({min(r):.2f}–{max(r):.2f})")
            print(f"| {group[5:]} | {median(w[0] for w in warm):.4f} | " + " | ".join(cells) + f" |  <- vs {', '.join(names)}")
        elif group.startswith("cold "):
            cold = [p[1]["cold"] for p in present]
            ratios = [c[3] for c in cold]
            print(f"| {group[5:]} | {cold[0][0]} | {median(c[1] for c in cold):.4f} | {median(c[2] for c in cold):.4f} | "
                  f"**{median(ratios):.2f}x** ({min(ratios):.2f}–{max(ratios):.2f}) |")
        elif group.startswith("quantise share "):
            shares = [p[1]["share"] for p in present]
            pct = [s[0] for s in shares]
            print(f"| {group[15:]} | {median(pct):.2f} % ({min(pct):.2f}–{max(pct):.2f}) | "
                  f"{median(s[1] for s in shares):.4f} ms |")
        elif group.startswith(("quantize ", "hadamard ")):
            impls = present[0][0]
            print(f"| {group} | " + ", ".join(f"{k} {median(p[0][k][0] for p in present):.3f} ms" for k in impls) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
