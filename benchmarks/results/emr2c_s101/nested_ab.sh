#!/bin/bash
# 828ec82 (VBMI layouts, /tmp/site_828) against 0c53c77 (plus the int16 value loop's nested masks, /tmp/site_new),
# alternating processes, three rounds, 2 threads, 32K tokens, both shapes (two_threads.py).
cd /tmp
for r in 1 2 3; do for b in 828 new; do
  echo "$b headline: $(PYTHONPATH=/tmp/site_$b /tmp/kvarn-ci-venv/bin/python /work/main/benchmarks/results/emr2c_s101/two_threads.py 32 8 128 32768)  smollm2: $(PYTHONPATH=/tmp/site_$b /tmp/kvarn-ci-venv/bin/python /work/main/benchmarks/results/emr2c_s101/two_threads.py 9 3 64 32768)"
done; done
