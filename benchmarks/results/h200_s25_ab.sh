#!/usr/bin/env bash
# Device call s25b: A/B on the Xeon of kvarn_attend before (c09c1f7's api.cpp, carried as .s15/old_api.cpp) and after
# d2eabb6 (no zero-filled scratch, no Hadamards for an all-fp16 batch): kvarn.attend_batch and the fp16 kernel at 1K,
# batch 1 and 16, 16 threads, one process per build, three alternating rounds (.s15/ab_attend.py).
set -uo pipefail
export PYTHONUNBUFFERED=1
build() {  # $1: site name
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_$1 \
    -C build-dir=build/cpu_$1 -C cmake.define.KVARN_CUDA=OFF . >"$OUT/build_$1.log" 2>&1 || { tail -20 "$OUT/build_$1.log"; exit 1; }
}
build new
cp native/cpu/api.cpp /tmp/api_new.cpp && cp .s15/old_api.cpp native/cpu/api.cpp && build old && cp /tmp/api_new.cpp native/cpu/api.cpp
echo "built both"
for r in 1 2 3; do
  for s in old new; do
    echo "$s $(PYTHONPATH=/tmp/site_$s python3 .s15/ab_attend.py 16)" | tee -a "$OUT/ab.log"
  done
done
