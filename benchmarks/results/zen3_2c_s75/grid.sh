#!/bin/bash
# Thirty-fifth session, Zen 3 box (2 vCPUs, AVX2 only, avx2 int16 default): the #3 target rows on the current code.
# 32K b1 targets (warm interleaved + cold + bandwidth), both shapes, three runs; then the 1K quantise share, six runs.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/zen3_2c_s75
py=${PY:-python}  # a venv with kvarn (the commit under test), torch 2.13.0 and pytest-benchmark
for r in 1 2 3; do
  KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md $py -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M)"
done
for r in 1 2 3 4 5 6; do
  KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    $py -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "share run$r: $(grep -o "= [0-9.]*% of a [0-9.]* ms" $out/share_run$r.md | tr "\n" " ")"
done
# The quantiser per (tile, KV head), one thread (the thirty-third session's script), two runs.
for r in 1 2; do $py $out/../zen4_2c_s73/qtile.py 3; done > $out/qtile.log 2>&1
# Runs 4-6 of the 32K loop were run afterwards with the same command (r in 4 5 6), the host being noisy;
# the A/B against the eighteenth session's build: ab_attend_old_9895626.log (../zen4_2c_s73/ab_attend.py, two venvs).
