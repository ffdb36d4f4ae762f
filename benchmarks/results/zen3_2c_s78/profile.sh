#!/bin/bash
# Thirty-eighth session, Zen 3 box: sampled profile of the avx2 int16 decode kernel at 32K, one thread, both shapes.
# A -g, unstripped build of 7dd1212 (-g changes no instruction), perf's cpu-clock event (no hardware counters in this VM).
set -e
cd /work/main && KVARN_CUDA=OFF pip install -q --no-build-isolation --no-deps --target /tmp/site_s78g \
    -C install.strip=false -C cmake.define.CMAKE_CXX_FLAGS=-g .
R=/work/main/benchmarks/results/zen3_2c_s78
for shape in 3,9,64 8,32,128; do
  PYTHONPATH=/tmp/site_s78g SHAPE=$shape perf record -q -e cpu-clock -F 20000 -o p_$shape.data python $R/loop.py
  echo "== SHAPE=$shape"; python $R/breakdown.py p_$shape.data /tmp/site_s78g/kvarn/_native.cpython-311-x86_64-linux-gnu.so
done
