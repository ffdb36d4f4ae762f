#!/usr/bin/env bash
# Lead's device call (s24): bench_cuda.py --quick after its float64 reference became kvarn.baselines.attention_numpy.
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
echo "tests skipped: bench only"
echo "[$(el) s] tested"
cd benchmarks
timeout 200 python3 bench_cuda.py --quick --out "$OUT" --tag s24quick >"$OUT/bench_quick.log" 2>&1; echo "bench --quick exit $?"
grep -E "check:|^ctx|FAILED" "$OUT/bench_quick.log" | head -20
echo "[$(el) s] end"
