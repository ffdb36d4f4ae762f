#!/usr/bin/env bash
# Lead's device call (s15), tree of 3055c5d (CUDA kernels prebuilt on the dev machine from the current sources: .s15/,
# md5s checked): (1) the whole test suite on the device host (Xeon: AVX-512 + VNNI + AVX-VNNI + AMX; H200) -- the
# blocked quantiser rows (3055c5d) on every ISA of a real Xeon, and the first GPU run of 92c0106's attend.cuh
# (SASS-identical locally); (2) quantiser timings and the quantise share at 16 threads.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; grep -o -E 'avx512_vnni|avx_vnni|amx_tile|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } | tee "$OUT/machine.txt"
md5sum -c --quiet .s15/src.md5 && echo "sources match .s15's library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s15/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
(cd /tmp && python3 -c 'import kvarn, kvarn.cuda as kc; print(kvarn.__version__, kvarn.available_isas(), kvarn.active_isa(), "cuda:", kc.is_available())') | tee -a "$OUT/machine.txt"
echo "[$(el) s] built"
timeout 330 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "passed|failed|error" "$OUT/tests_all.log" | tail -3
echo "[$(el) s] tested"
(cd benchmarks/results && python3 qisa_s15.py avx512 avx2 avx512 avx2) | tee "$OUT/xeon_qisa.log"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_CONTEXTS=1024,32768 KVARN_BENCH_BATCHES=1 \
  KVARN_BENCH_TABLE="$OUT/xeon_16t_table.md" timeout 120 python3 -m pytest -q -s -p no:cacheprovider bench_attend.py bench_quantize.py \
  -k "quantize_share or (test_quantize and avx512)" >"$OUT/xeon_16t_bench.log" 2>&1; echo "bench exit $?"
grep -E "quantise per generated token" "$OUT/xeon_16t_bench.log"
echo "[$(el) s] end"
