#!/usr/bin/env bash
# Forty-fourth session, device call s84b: the sanitizers on the lent machine since the int8 centring (4a3a94b) and the
# avx512 L2 prefetch (13bbdc8) — the Xeon is the only machine with AVX-VNNI, so avx2's int8 `vpdpbusd` form runs
# instrumented only here. scripts/asan.sh (ASan + UBSan, native drivers per ISA, simd_test's every score mode), then
# scripts/tsan.sh, then the Python tests that reach the kernels over an instrumented build (scripts/asan_python.sh),
# then, with the time left, compute-sanitizer's workload over the CUDA build (scripts/gpu_run.sh sanitize).
set -uo pipefail
. benchmarks/results/device_prologue.sh
lscpu | grep -E "Model name|^CPU\(s\)|L3" > "$OUT/machine.txt"; grep -o -w -E "avx512_vnni|avx_vnni|amx_int8" /proc/cpuinfo | sort -u >> "$OUT/machine.txt"
export CMAKE_BUILD_PARALLEL_LEVEL=16
timeout 200 bash scripts/asan.sh /tmp/b_asan >"$OUT/asan.log" 2>&1; echo "asan.sh rc=$? [$(el) s]"; tail -2 "$OUT/asan.log"
timeout 150 bash scripts/tsan.sh /tmp/b_tsan >"$OUT/tsan.log" 2>&1; echo "tsan.sh rc=$? [$(el) s]"; tail -2 "$OUT/tsan.log"
# test_simd runs every ISA and score mode itself (avx2's int8 as AVX-VNNI here)
PYTHON=python3 timeout 200 bash scripts/asan_python.sh /tmp/asan_py/site -- tests/test_simd.py tests/test_cache.py -x >"$OUT/asan_python.log" 2>&1
echo "asan_python rc=$? [$(el) s]"; tail -1 "$OUT/asan_python.log"
left=$(( 560 - $(el) ))
if [ $left -gt 200 ]; then
  OUT=$OUT/gpu timeout $left bash scripts/gpu_run.sh build sanitize >"$OUT/gpu_run.log" 2>&1
  echo "gpu_run sanitize rc=$? [$(el) s]"; tail -8 "$OUT/gpu_run.log"
fi
echo "[$(el) s] end"
