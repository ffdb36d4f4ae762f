"""Shared setup for the kvarn benchmarks (pytest-benchmark, never timed tests).

Threads: KVARN_BENCH_THREADS (default: all cores) is used by kvarn, torch and
the BLAS under numpy alike, so every row of a group runs with the same count.
KVARN_BENCH_QUICK=1 trims the size lists (CI smoke runs); KVARN_BENCH_BUDGET is
the seconds of timing per attention row (default 1.0).

At the end a summary table is printed (and written to $KVARN_BENCH_TABLE if
set): per group, every implementation's min / median time, bytes moved, GB/s,
the fraction of the measured copy bandwidth, and speed-ups against the
group's fp16, numpy and torch rows.
"""
import os

THREADS = int(os.environ.get("KVARN_BENCH_THREADS", "0")) or os.cpu_count()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(THREADS)  # not setdefault: a value from the shell would give BLAS another count
QUICK = os.environ.get("KVARN_BENCH_QUICK") == "1"

import numpy as np  # noqa: E402

import kvarn  # noqa: E402

kvarn.set_num_threads(THREADS)

RESULTS = []  # (group, name, min_s, median_s, bytes, extra)
COPY_GBPS = {}  # name -> GB/s of the large copy
READ_GBPS = {}  # name -> GB/s of the large read


def record(benchmark, bytes_moved, **extra):
    """Call after benchmark(...): stores bytes and GB/s in extra_info and the summary."""
    st = benchmark.stats.stats
    benchmark.extra_info["bytes"] = int(bytes_moved)
    benchmark.extra_info["GB/s"] = round(bytes_moved / st.min / 1e9, 3)
    benchmark.extra_info["threads"] = THREADS
    benchmark.extra_info.update(extra)
    RESULTS.append((benchmark.group, benchmark.name, st.min, st.median, bytes_moved, extra))


def record_calls(benchmark, impl, times, bytes_moved, **extra):
    """A row for calls timed inside the benchmarked function (one call of several in a step):
    min / median of `times` (seconds per call) with the bytes ONE call reads, so its GB/s is
    that call's. Kept apart from the benchmark's own stats (the whole function): in the summary
    and in extra_info["calls"][impl]."""
    mn, med = min(times), float(np.median(times))
    benchmark.extra_info.setdefault("calls", {})[impl] = dict(
        bytes=int(bytes_moved), min_s=mn, median_s=med, n=len(times), **{"GB/s": round(bytes_moved / mn / 1e9, 3)})
    RESULTS.append((benchmark.group, f"{benchmark.name}[{impl}]", mn, med, bytes_moved, dict(extra, impl=impl)))


def pytest_report_header(config):
    import platform

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"kvarn bench: cpu={cpu!r} cores={os.cpu_count()} threads={THREADS} "
        f"isas={kvarn.available_isas()} active={kvarn.active_isa()} quick={QUICK}"
    )


def _table():
    if not RESULTS:
        return ""
    copy = max(COPY_GBPS.values()) if COPY_GBPS else None
    lines = []
    if COPY_GBPS:
        lines.append("copy bandwidth (GB/s, read+write bytes / time): " + ", ".join(f"{k} {v:.1f}" for k, v in COPY_GBPS.items()))
    if READ_GBPS:
        lines.append("read bandwidth (GB/s, bytes read / time): " + ", ".join(f"{k} {v:.1f}" for k, v in READ_GBPS.items()))
    groups = {}
    for r in RESULTS:
        groups.setdefault(r[0], []).append(r)
    for g, rows in groups.items():
        lines.append("")
        lines.append(f"## {g}")
        lines.append("| impl | min ms | median ms | MB moved | GB/s | % of copy bw | vs fp16 | vs numpy | vs torch |")
        lines.append("|---|---|---|---|---|---|---|---|---|")

        def find(prefix):  # a reference row: one call of that implementation (not a compare=False row)
            c = [r for r in rows if r[5].get("impl", "").startswith(prefix) and r[5].get("compare", True)]
            return min((r[2] for r in c), default=None)

        ref = {k: find(k) for k in ("fp16", "numpy", "torch")}
        for _, name, mn, med, nbytes, extra in sorted(rows, key=lambda r: r[2]):
            # compare=False: a row timing something else than one call (a whole cold step, a copy): no ratios.
            # rate=False: a row whose bytes per time mean nothing (a round of blocks with pauses between them).
            gbps = nbytes / mn / 1e9
            has_rate = extra.get("rate", True)
            rate = f"{gbps:.2f}" if has_rate else "-"
            frac = f"{100 * gbps / copy:.0f}%" if copy and has_rate else "-"
            ratios = [f"{ref[k] / mn:.2f}x" if ref[k] and extra.get("compare", True) else "-"
                      for k in ("fp16", "numpy", "torch")]
            label = extra.get("impl", name)
            lines.append(
                f"| {label} | {mn * 1e3:.3f} | {med * 1e3:.3f} | {nbytes / 1e6:.2f} | {rate} | {frac} | " + " | ".join(ratios) + " |"
            )
        for *_, extra in rows:
            if "ratio" in extra:
                lines.append(
                    f"cold ({extra['layers']} layer copies read in turn): kvarn {extra['kvarn_ms']} ms, "
                    f"fp16 {extra['fp16_ms']} ms per call (minima) -> kvarn {extra['ratio']}x faster"
                )
            if "warm_ratios" in extra:
                lines.append(
                    "warm, interleaved in blocks: kvarn " + f"{extra['warm_ms']['kvarn']} ms -> "
                    + ", ".join(f"{r}x {name} ({extra['warm_ms'][name]} ms)" for name, r in extra["warm_ratios"].items())
                )
            if "warm_median_ratios" in extra:  # its own line: aggregate_tables.py reads the "warm, ..." one
                lines.append(
                    "medians of the same series (each implementation's blocks hold different numbers of calls, so "
                    "minima are over different sample counts): " + ", ".join(
                        f"{r}x {name}" for name, r in extra["warm_median_ratios"].items())
                )
            if "warm_ratios_int8" in extra:  # not "warm, ...": aggregate_tables.py reads that line for the default mode
                lines.append(
                    "int8 score mode, same series: kvarn-int8 " + f"{extra['warm_ms']['kvarn-int8']} ms -> "
                    + ", ".join(f"{r}x {name}" for name, r in extra["warm_ratios_int8"].items())
                )
            if "one_call_speedup" in extra:
                lines.append(
                    "multi-token step, interleaved: one call " + ", ".join(
                        f"{extra['one_call_speedup'][c]}x faster than token by token for {c}" for c in ("kvarn", "fp16"))
                    + "; kvarn " + ", ".join(f"{r}x fp16 ({form})" for form, r in extra["kvarn_vs_fp16"].items())
                )
            if "share_pct" in extra:
                lines.append(
                    f"quantise per generated token {extra['quant_us_per_token']} us = {extra['share_pct']}% of a "
                    f"{extra['decode_ms']} ms decode step (same threads, same run)"
                )
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter):
    text = _table()
    if not text:
        return
    terminalreporter.write_sep("=", "kvarn benchmark summary")
    terminalreporter.write_line(text)
    path = os.environ.get("KVARN_BENCH_TABLE")
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")

