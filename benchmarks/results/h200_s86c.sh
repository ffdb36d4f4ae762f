#!/usr/bin/env bash
# Forty-sixth session, device call s86c: the native drivers under AddressSanitizer + UBSan (scripts/asan.sh) and
# ThreadSanitizer (scripts/tsan.sh) on the lent Xeon, whose avx2 kernels take their AVX-VNNI forms (the Zen 4 box,
# where CI runs asan.sh through tests/test_native.py, has no AVX-VNNI) and whose pool has 16 threads. (Repeats s84b.)
# For a rerun: benchmarks/results/h200_s84b.sh does this, asan_python.sh and compute-sanitizer in one call.
set -uo pipefail
. benchmarks/results/device_prologue.sh
grep -o -w -E 'avx_vnni|avx512_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 280 bash scripts/asan.sh /tmp/build-asan >"$OUT/asan.log" 2>&1; rc=$?
echo "[$(el) s] asan rc $rc"; tail -6 "$OUT/asan.log"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 280 bash scripts/tsan.sh /tmp/build-tsan >"$OUT/tsan.log" 2>&1; rc=$?
echo "[$(el) s] tsan rc $rc"; tail -6 "$OUT/tsan.log"
