#!/usr/bin/env bash
# Device call s26 (ninth session): CUDA kernels prebuilt here (.s15/, .cu/.cuh/.h/.cpp md5s checked; since s26b with api.cu's malloc fix),
# the CPU core and Python built here. The whole test suite (Xeon CPU tests on every ISA + GPU tests, incl. the new
# sink-rows and out-of-memory tests), the new GPU tests under compute-sanitizer memcheck, then the 1K decode rows at
# 16 threads (kvarn vs the fp16 kernel) on the code with the pool's exception handling and the merge's finite check.
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
timeout 360 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/tests_all.log" | head -20; tail -2 "$OUT/tests_all.log"
echo "[$(el) s] tested"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "sink_longer or cpu_records_decode or gpu_cache_records" >"$OUT/memcheck_new.log" 2>&1; echo "memcheck exit $?"
tail -3 "$OUT/memcheck_new.log"
echo "[$(el) s] sanitized"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_BATCHES=1,16 KVARN_BENCH_TABLE="$OUT/xeon_16t_1k_table_s26.md" \
  timeout 150 python3 -m pytest -q -p no:cacheprovider bench_attend.py \
  -k "test_attend and (avx512-int16] or fp16-avx512] or torch])" >"$OUT/xeon_16t_1k_bench_s26.log" 2>&1; echo "bench exit $?"
tail -3 "$OUT/xeon_16t_1k_bench_s26.log"; cat "$OUT/xeon_16t_1k_table_s26.md" 2>/dev/null | head -30
echo "[$(el) s] end"
