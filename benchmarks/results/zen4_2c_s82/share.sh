#!/bin/bash
# Forty-second session, Zen 4 box: the 1K quantise share (the forty-first session's command), three runs, on the final
# code (1454582, installed with --target /tmp/site_new); the CI venv's pytest-benchmark.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen4_2c_s82
for r in 1 2 3; do
  PYTHONPATH=/tmp/site_new KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "share run$r rc=$? $(date -u +%H:%M): $(grep -o "= [0-9.]*% of a [0-9.]* ms" $out/share_run$r.md | tr "\n" " ")"
done
