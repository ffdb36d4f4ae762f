#!/usr/bin/env bash
# Fortieth session, device call s80f (the lent Xeon, CPU only): the native drivers under ASan + UBSan
# (scripts/asan.sh) and ThreadSanitizer (scripts/tsan.sh) with the final split rule, every ISA including avx512.
set -uo pipefail
. benchmarks/results/device_prologue.sh
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 280 bash scripts/asan.sh /tmp/build-asan >"$OUT/asan.log" 2>&1; echo "asan.sh rc $?" | tee -a "$OUT/asan.log"
grep -E "runtime error|ERROR|all SIMD|^== " "$OUT/asan.log" | sort | uniq -c | tail -8
echo "[$(el) s] asan"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 250 bash scripts/tsan.sh /tmp/build-tsan >"$OUT/tsan.log" 2>&1; echo "tsan.sh rc $?" | tee -a "$OUT/tsan.log"
grep -cE "WARNING: ThreadSanitizer" "$OUT/tsan.log"; grep -E "all SIMD" "$OUT/tsan.log"
echo "[$(el) s] end"
