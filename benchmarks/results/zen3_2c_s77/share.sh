#!/bin/bash
# Thirty-seventh session, Zen 3 box: the 1K quantise share (the thirty-fifth session's command) on the new build.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen3_2c_s77
py=/tmp/kvarn-ci-venv/bin/python
for r in 1 2 3 4 5 6; do
  PYTHONPATH=/tmp/site_s77 KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    $py -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "share run$r: $(grep -o "= [0-9.]*% of a [0-9.]* ms" $out/share_run$r.md | tr "\n" " ")"
done
