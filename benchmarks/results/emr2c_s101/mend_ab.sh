#!/bin/bash
# d4cb18d (/tmp/site_new) against the review's kernel mend (/tmp/site_m: one int16 score loop with three layouts,
# with_flag(s) dispatch), alternating processes, three rounds, 2 threads, 32K tokens, both shapes (two_threads.py).
cd /tmp
for r in 1 2 3; do for b in new m; do
  echo "$b smollm2: $(PYTHONPATH=/tmp/site_$b /tmp/kvarn-ci-venv/bin/python /work/main/benchmarks/results/emr2c_s101/two_threads.py 9 3 64 32768)  headline: $(PYTHONPATH=/tmp/site_$b /tmp/kvarn-ci-venv/bin/python /work/main/benchmarks/results/emr2c_s101/two_threads.py 32 8 128 32768)"
done; done
