#!/bin/bash
# Fifty-second session (Zen 4 box, 2 vCPUs): multi-token steps, warm (bench_attend.py's test_multi_token_step,
# two runs) and cold (steps_cold.py). Run from benchmarks/ with kvarn on PYTHONPATH.
set -e
out=results/zen4_2c_s92
for run in 1 2; do
  KVARN_BENCH_CONTEXTS=1024,4096,32768 KVARN_BENCH_TABLE=$out/steps_warm_run$run.md \
    python -m pytest -q -p no:cacheprovider bench_attend.py -k multi_token --benchmark-columns=min,median,rounds \
    > $out/steps_warm_run$run.log 2>&1
done
python $out/steps_cold.py > $out/steps_cold.log 2>&1
