#!/bin/bash
# Sixty-first session: three more runs of the 32K b1 target rows on the new build (828ec82, /tmp/site_new), then the
# quantise share at 1K three times (the fifty-eighth session's command); the same box as ab_grid.sh.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/emr2c_s101/new
for r in 4 5 6; do
  PYTHONPATH=/tmp/site_new KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
    KVARN_BENCH_TABLE=$out/t32k_run$r.md /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider \
    bench_attend.py -k "bandwidth or warm_interleaved or decode_cold" > $out/t32k_run$r.log 2>&1
  echo "new 32K run$r rc=$? $(date -u +%H:%M:%S)"
done
for r in 1 2 3; do
  PYTHONPATH=/tmp/site_new KVARN_BENCH_THREADS=2 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_TABLE=$out/share_run$r.md \
    /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share > $out/share_run$r.log 2>&1
  echo "new share run$r rc=$? $(date -u +%H:%M:%S)"
done
