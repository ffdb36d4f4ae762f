#!/bin/bash
# Forty-fifth session, Zen 4 box (AMD EPYC family 25 model 17, 2 vCPUs, AVX-512 VNNI, no PMU counters in the VM):
# sampled profile of the int16 decode kernel at 32K, one thread, both shapes, avx512 and forced avx2; a -g, unstripped
# build of the tree (0232a70; -g changes no instruction), perf's cpu-clock event at 20 kHz, the thirty-eighth
# session's loop.py (attend back to back for 8 s).
set -e
S=/tmp/site_s85g R=/work/main/benchmarks/results
rm -rf $S  # pip --target does not replace an existing package
cd /work/main && KVARN_CUDA=OFF pip install -q --no-build-isolation --no-deps --target $S \
    -C install.strip=false -C cmake.define.CMAKE_CXX_FLAGS=-g .
cd /tmp
for isa in avx512 avx2; do for shape in 3,9,64 8,32,128; do
  KVARN_ISA=$isa PYTHONPATH=$S SHAPE=$shape perf record -q -e cpu-clock -F 20000 -o ${isa}_$shape.data python $R/zen3_2c_s78/loop.py
done; done
python $R/zen4_2c_s85/shares.py avx512_3,9,64.data avx512_8,32,128.data avx2_3,9,64.data avx2_8,32,128.data
