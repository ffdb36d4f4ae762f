#!/usr/bin/env bash
# Lead's device call (s17), tree of e358579 (CUDA kernels prebuilt from the current sources: .s15/, md5s checked):
# (1) the whole test suite on the device host (Xeon 16 threads + H200) after the thread-pool changes (fork-safe
#     pool, no idle re-spin, at most one helper per CPU) and the validation/robustness fixes;
# (2) the CPU decode benchmarks at 16 threads (1K and 32K, batch 1 and 16; default path, fp16 baseline, cold steps)
#     and the quantise share -- to see that the pool change costs nothing where 16 threads run.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; } | tee "$OUT/machine.txt"
md5sum -c --quiet .s15/src.md5 && echo "sources match .s15's library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s15/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
echo "[$(el) s] built"
timeout 330 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "passed|failed|error" "$OUT/tests_all.log" | tail -3
echo "[$(el) s] tested"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_COLD_MB=1200 KVARN_BENCH_CONTEXTS=1024,32768 KVARN_BENCH_BATCHES=1,16 \
  KVARN_BENCH_TABLE="$OUT/xeon_16t_table.md" timeout 200 python3 -m pytest -q -p no:cacheprovider bench_attend.py \
  -k "copy_bandwidth or quantize_share or decode_cold or (test_attend and (avx512-int16 or fp16-avx512) and not novnni)" \
  >"$OUT/xeon_16t_bench.log" 2>&1; echo "bench exit $?"
tail -2 "$OUT/xeon_16t_bench.log"; grep -E "quantise per generated token|cold \(" "$OUT/xeon_16t_table.md" | head -12
echo "[$(el) s] end"
