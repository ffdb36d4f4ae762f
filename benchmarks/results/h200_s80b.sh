#!/usr/bin/env bash
# Fortieth session, device call s80b (the lent Xeon, CPU only): work items per thread in attend's split layout,
# 2 (as committed) against 4 and 8, in alternating processes (xeon_s80_scaling/ab_items.py), 4 / 8 / 16 threads.
set -uo pipefail
. benchmarks/results/device_prologue.sh
D=benchmarks/results/xeon_s80_scaling
for n in 2 4 8; do
  rm -rf /tmp/tree$n && mkdir /tmp/tree$n && cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/tree$n/ &&
    sed -i "s/constexpr int64_t kItemsPerThread = 2;/constexpr int64_t kItemsPerThread = $n;/" /tmp/tree$n/native/cpu/api.cpp &&
    grep -c "kItemsPerThread = $n;" /tmp/tree$n/native/cpu/api.cpp
  build_site /tmp/tree$n /tmp/site$n &
done
wait
echo "[$(el) s] built"
for round in 1 2 3 4; do
  for n in 2 4 8; do timeout 100 python3 $D/ab_items.py /tmp/site$n items$n; done
done 2>&1 | tee "$OUT/ab_items.log"
echo "[$(el) s] end"
