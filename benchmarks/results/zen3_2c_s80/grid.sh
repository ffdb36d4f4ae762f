#!/bin/bash
# Fortieth session, Zen 3 box (2 vCPUs, AVX2 only): the #3 target rows at 32K b1 (warm interleaved + cold + bandwidth)
# on the final split rule (the tree of 67aef70 installed with --target /tmp/site_40c), six runs, as the thirty-seventh
# session's grid.sh; the per-run figures: python3 ../zen3_2c_s77/summarise.py 1 6 (from this folder).
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen3_2c_s80
py=/tmp/kvarn-ci-venv/bin/python  # torch 2.13.0, pytest-benchmark
for r in 1 2 3 4 5 6; do
  PYTHONPATH=/tmp/site_40c KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md $py -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M)"
done
