#!/usr/bin/env bash
# Lead's device call (s23, two H200s): every PagedKVCache call now runs on the cache's GPU and restores the caller's
# current device, now checked inline before entering the context manager: tests/test_cuda.py with both GPUs visible.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
grep -E '\.(cu|cuh|h|cpp)$' .s15/src.md5 > /tmp/src_kernels.md5
md5sum -c --quiet /tmp/src_kernels.md5 && echo "kernel sources match .s15's library ($(wc -l < /tmp/src_kernels.md5) files)" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s15/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; git checkout -- native/cuda/CMakeLists.txt 2>/dev/null; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
echo "[$(el) s] built"
nvidia-smi -L; timeout 250 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/tests_all.log" | head -20; tail -2 "$OUT/tests_all.log"
echo "[$(el) s] tested"
echo "[$(el) s] end"
