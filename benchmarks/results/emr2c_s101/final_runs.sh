#!/bin/bash
# Sixty-first session: the final build (0c53c77, /tmp/site_new): the 32K b1 target rows three times, then the quantise
# share at 1K three times (the commands of ab_grid.sh and more_runs.sh); the same box. RUNS="4 5 6" SHARE=0: three
# more runs of the 32K rows alone. (final_slowspell/: its first pass, in a slow spell of the host: the copy rate 21.6-22.9
# GB/s against 24.2-25.8, kvarn's SmolLM2 call 0.30-0.37 ms; kept, not quoted.)
cd /work/main/benchmarks
out=/work/main/benchmarks/results/emr2c_s101/final
mkdir -p $out
for r in ${RUNS:-1 2 3}; do
  PYTHONPATH=/tmp/site_new KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider \
    bench_attend.py -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "final 32K run$r rc=$? $(date -u +%H:%M:%S)"
done
[ "${SHARE:-1}" = 0 ] && exit 0
for r in 1 2 3; do
  PYTHONPATH=/tmp/site_new KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "final share run$r rc=$? $(date -u +%H:%M:%S)"
done
