#!/bin/bash
# Thirty-third session, Zen 4 box (2 vCPUs, avx512 default): the #3 target rows on the current code.
# 32K b1 targets (warm interleaved + cold + bandwidth), both shapes, three runs; then the 1K quantise share, six runs.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen4_2c_s73
site=${SITE:-/work/scratch/site_a}
for r in 1 2 3; do
  PYTHONPATH=$site KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md python -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M)"
done
for r in 1 2 3 4 5 6; do
  PYTHONPATH=$site KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    python -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "share run$r: $(grep -o "= [0-9.]*% of a [0-9.]* ms" $out/share_run$r.md | tr "\n" " ")"
done
