#!/usr/bin/env bash
# Lead's device call (s17 A/B): the thread pool before (fc2bb9c's api.cpp) and after e358579 (fork-safe pool, no idle
# re-spin, one helper per CPU at most), same Python, CPU-only builds, alternating, 16 threads on the Xeon:
# decode attention min ms over 1 s at 1K batch 1, 32K batch 1, 32K batch 16 (warm; .s17/ab.py).
set -uo pipefail
for v in old new; do
  rm -rf /tmp/t_$v && mkdir /tmp/t_$v && cp -r CMakeLists.txt pyproject.toml README.md native include src /tmp/t_$v/
done
cp .s17/api_old.cpp /tmp/t_old/native/cpu/api.cpp
for v in old new; do
  (cd /tmp/t_$v && CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_$v \
     -C build-dir=/tmp/b_$v -C cmake.define.KVARN_CUDA=OFF . >"$OUT/build_$v.log" 2>&1) || { tail -20 "$OUT/build_$v.log"; exit 1; }
done
echo built
AB="$PWD/.s17/ab.py"  # the same file as results/pool_ab_s17.py
for r in 1 2 3 4; do for v in old new; do (cd /tmp && PYTHONPATH=/tmp/site_$v python3 "$AB" $v); done; done | tee "$OUT/ab.log"
