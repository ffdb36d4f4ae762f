#!/usr/bin/env bash
# Thirty-ninth session, device call s79f (the lent Xeon, CPU only): scripts/tsan.sh, the native drivers under
# ThreadSanitizer on scalar, avx2 and avx512 (VNNI), with the concurrent-callers case of native_test.cpp.
set -uo pipefail
. benchmarks/results/device_prologue.sh
lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/machine.txt"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 540 bash scripts/tsan.sh /tmp/b_tsan >"$OUT/tsan.log" 2>&1
echo "rc=$? [$(el) s]" | tee -a "$OUT/tsan.log"
grep -E "native test|failure|C example|ThreadSanitizer|match scalar" "$OUT/tsan.log"
