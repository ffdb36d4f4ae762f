#!/bin/bash
# Sixty-sixth session: #3's target rows on the session's code (d37f6d6, the library as b197cd0 left it; CPU build in
# /tmp/site_b), this box: emr2c_s105/standing.sh unchanged but for the output folder (the sixty-first session's
# final_runs.sh commands); summarised by ../zen4_2c_s82/summarise.py avx512 1 6.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/emr2c_s106/${OUTDIR:-standing}
mkdir -p $out
for r in ${RUNS:-1 2 3 4 5 6}; do
  PYTHONPATH=${SITE:-/tmp/site_b} KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider \
    bench_attend.py -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "32K run$r rc=$? $(date -u +%H:%M:%S)"
done
[ "${SHARE:-1}" = 0 ] && exit 0
for r in 1 2 3; do
  PYTHONPATH=${SITE:-/tmp/site_b} KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "share run$r rc=$? $(date -u +%H:%M:%S)"
done
