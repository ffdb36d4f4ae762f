#!/usr/bin/env bash
# Lead's device call (s14), tree of dd7478b: the 16-lane quantiser scale update (ac9f31b) on the Xeon --
# the CPU test files that cover the quantiser and the records on every ISA, then the quantise share at 16 threads.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
md5sum -c --quiet .s10/src.md5 && echo "sources match .s10's library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s10/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
(cd /tmp && python3 -c 'import kvarn; print(kvarn.available_isas(), kvarn.active_isa())')
echo "[$(el) s] built"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py tests/test_quantize.py tests/test_cache.py tests/test_hadamard.py \
  >"$OUT/tests.log" 2>&1; echo "pytest exit $?"; tail -1 "$OUT/tests.log"
echo "[$(el) s] tested"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_CONTEXTS=1024,32768 KVARN_BENCH_BATCHES=1 \
  KVARN_BENCH_TABLE="$OUT/xeon_16t_table.md" timeout 120 python3 -m pytest -q -s -p no:cacheprovider bench_attend.py bench_quantize.py \
  -k "quantize_share or (test_quantize and avx512)" >"$OUT/xeon_16t_bench.log" 2>&1; echo "bench exit $?"
grep -E "quantise per generated token" "$OUT/xeon_16t_bench.log"
echo "[$(el) s] end"
