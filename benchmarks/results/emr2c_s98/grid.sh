#!/bin/bash
# Fifty-eighth session, Emerald Rapids box (Intel Xeon family 6 model 207, 2 vCPUs, AVX-512 VNNI; machine.txt): the
# 32K b1 target rows (warm interleaved + cold + bandwidth), both shapes, three runs, then the 1K quantise share, three
# runs, on main's 79dcd3a installed with --target /tmp/site_b; the CI venv's torch and pytest-benchmark.
# ../zen4_2c_s82/summarise.py avx512 1 3 (run in this folder) prints the 32K figures.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/emr2c_s98
for r in 1 2 3; do
  PYTHONPATH=/tmp/site_b KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M)"
done
for r in 1 2 3; do
  PYTHONPATH=/tmp/site_b KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "share run$r rc=$? $(date -u +%H:%M)"
done
