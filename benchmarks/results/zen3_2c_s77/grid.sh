#!/bin/bash
# Thirty-seventh session, Zen 3 box (2 vCPUs, AVX2 only): the avx2 score loops' new unpacking at the #3 target rows.
# 1) two threads, 32K b1, both shapes: ab_attend.py (the thirty-third session's script) under the old build (f7acd60,
#    the CI venv) and the new one (installed with --target /tmp/site_s77) in alternating processes;
# 2) the 32K b1 target rows (warm interleaved + cold + bandwidth), six runs, on the new build.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen3_2c_s77
py=/tmp/kvarn-ci-venv/bin/python  # torch 2.13.0, pytest-benchmark, kvarn f7acd60
for r in 1 2 3 4; do
  echo -n "old "; $py $out/../zen4_2c_s73/ab_attend.py
  echo -n "new "; PYTHONPATH=/tmp/site_s77 $py $out/../zen4_2c_s73/ab_attend.py
done > $out/ab_attend_2t.log 2>&1
echo "A/B done $(date -u +%H:%M)"
for r in 1 2 3 4 5 6; do
  PYTHONPATH=/tmp/site_s77 KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md $py -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M)"
done
