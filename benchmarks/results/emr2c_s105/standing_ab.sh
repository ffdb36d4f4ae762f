#!/bin/bash
# Sixty-fifth session: is the slower 32K call of standing/ (headline 2.16-2.48 ms against 1.66-1.70 in the sixty-first
# session) the code or the box? The sixty-first session's final build (0c53c77, /tmp/site_0c5) and this session's start
# (e32a4a1, /tmp/site_b) alternating, ROUNDS rounds, the 32K b1 target rows with this checkout's bench_attend.py.
cd /work/main/benchmarks
out=/work/main/benchmarks/results/emr2c_s105/standing_ab
mkdir -p $out/0c5 $out/b
for r in $(seq ${ROUNDS:-3}); do
  for side in 0c5 b; do
    PYTHONPATH=/tmp/site_$side KVARN_BENCH_THREADS=2 KVARN_BENCH_BUDGET=0.6 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
      KVARN_BENCH_TABLE=$out/$side/t32k_run$r.md /tmp/kvarn-ci-venv/bin/python -m pytest -q -p no:cacheprovider \
      bench_attend.py -k "bandwidth or warm_interleaved or decode_cold" > $out/$side/t32k_run$r.log 2>&1
    echo "$side run$r rc=$? $(date -u +%H:%M:%S)"
  done
done
