#!/bin/bash
# Forty-third session, Zen 4 box (2 vCPUs, avx512 by default): the 32K b1 target rows (warm interleaved + cold +
# bandwidth), both shapes, three runs, on the build with the L2 prefetch (13bbdc8, installed with --target
# /tmp/site_s43b); the CI venv's torch and pytest-benchmark. ../zen4_2c_s82/summarise.py avx512 1 3 (run in this
# folder) prints the figures.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen4_2c_s83
for r in 1 2 3; do
  PYTHONPATH=/tmp/site_s43b KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M)"
done
