#!/bin/bash
# Sixty-first session, the same Emerald Rapids box as results/emr2c_s98/machine.txt: the 32K b1 target rows (warm
# interleaved + cold + bandwidth), both shapes, main before (/tmp/site_b: 5b563a0) and after the avx512 integer
# kernels' VBMI layouts (/tmp/site_new), alternating, three runs each; the CI venv's torch and pytest-benchmark.
# ../zen4_2c_s82/summarise.py avx512 1 3 in old/ and new/ prints each build's 32K figures.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/emr2c_s101
mkdir -p $out/old $out/new
for r in 1 2 3; do
  for build in old new; do
    site=/tmp/site_b; [ $build = new ] && site=/tmp/site_new
    PYTHONPATH=$site KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
      KVARN_BENCH_TABLE=$out/$build/t32k_run$r.md /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider \
      bench_attend.py -k "bandwidth or warm_interleaved or decode_cold" > $out/$build/t32k_run$r.log 2>&1
    echo "$build 32K run$r rc=$? $(date -u +%H:%M:%S)"
  done
done
