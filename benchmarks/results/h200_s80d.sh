#!/usr/bin/env bash
# Fortieth session, device call s80d (the lent Xeon, CPU only): attend's split rule, three builds in alternating
# processes (xeon_s80_scaling/ab_items.py) at 1K, 4K and 32K, 2 / 4 / 8 / 16 threads: two items per thread (as until
# a171e52), eight (a171e52), and the committed rule (eight while each split keeps 16 units, else at least two);
# then test_cache.py + test_simd.py on the committed rule. The two older api.cpp came along as $D/api_items2.cpp.tmp
# (git show 8806b1f:native/cpu/api.cpp) and $D/api_items8.cpp.tmp (git show a171e52:native/cpu/api.cpp), not kept.
set -uo pipefail
. benchmarks/results/device_prologue.sh
D=benchmarks/results/xeon_s80_scaling
for v in items2 items8 rule; do
  rm -rf /tmp/tree_$v && mkdir /tmp/tree_$v && cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/tree_$v/
  [ $v != rule ] && cp $D/api_$v.cpp.tmp /tmp/tree_$v/native/cpu/api.cpp
  build_site /tmp/tree_$v /tmp/site_$v &
done
wait
echo "[$(el) s] built"
for round in 1 2 3 4; do
  for v in items2 items8 rule; do timeout 100 python3 $D/ab_items.py /tmp/site_$v $v 2,4,8,16 1024,4096,32768; done
done > "$OUT/ab_rule.log" 2>&1
echo "[$(el) s] ab"
PYTHONPATH=/tmp/site_rule KVARN_REQUIRE_ISAS=avx2,avx512 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cache.py \
  tests/test_simd.py 2>&1 | tail -3 | tee "$OUT/tests.log"
echo "[$(el) s] end"
