#!/usr/bin/env bash
# Lead's device call (s11), on the tree of 5e67dd3 (CUDA kernels prebuilt on the dev machine: .s10/, md5s checked):
# (1) the whole test suite on the device host (Xeon: AVX-512 + VNNI + AVX-VNNI + AMX; H200): the CPU tests on
#     every ISA of a real Xeon and the GPU tests, with the final code of both;
# (2) an Nsight Compute profile of the served kernel at 32K x 8 (VAR 16: never profiled; docs/cuda.md "Next" 2);
# (3) the CPU decode benchmarks at 16 threads, 1K and 32K, batch 1 and 16 (default path, fp16 baseline, torch,
#     warm and cold), and the quantise share -- the Xeon rows of RESULTS.md §2 with the final CPU code.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; grep -o -E 'avx512_vnni|avx_vnni|amx_tile|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } | tee "$OUT/machine.txt"
md5sum -c --quiet .s10/src.md5 && echo "sources match .s10's library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s10/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
(cd /tmp && python3 -c 'import kvarn, kvarn.cuda as kc; print(kvarn.__version__, kvarn.available_isas(), kvarn.active_isa(), "cuda:", kc.is_available())') | tee -a "$OUT/machine.txt"
echo "[$(el) s] built"
timeout 330 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "passed|failed|error" "$OUT/tests_all.log" | tail -3
echo "[$(el) s] tested"
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats"
timeout 100 ncu --clock-control none --kernel-name regex:attend_kernel --launch-skip 1 --launch-count 1 \
  $SEC --section SourceCounters --warp-sampling-interval 0 --import-source yes -f -o /tmp/p16 \
  python3 benchmarks/bench_cuda.py --profile 32768x8 >"$OUT/ncu16_run.log" 2>&1 || { echo "ncu failed"; tail -5 "$OUT/ncu16_run.log"; }
if [ -f /tmp/p16.ncu-rep ]; then
  ncu -i /tmp/p16.ncu-rep --page details >"$OUT/ncu16_details.txt" 2>&1
  ncu -i /tmp/p16.ncu-rep --page source --csv --print-source sass >"$OUT/ncu16_sass.csv" 2>&1
  grep -E "Duration|DRAM Throughput|L2 Hit|Issued Ipc|Warp Cycles Per Issued|No Eligible|Registers Per|Achieved Occ" "$OUT/ncu16_details.txt" | head -12
fi
echo "[$(el) s] profiled"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_COLD_MB=1200 KVARN_BENCH_CONTEXTS=1024,32768 KVARN_BENCH_BATCHES=1,16 \
  KVARN_BENCH_TABLE="$OUT/xeon_16t_table.md" timeout 200 python3 -m pytest -q -p no:cacheprovider bench_attend.py \
  -k "copy_bandwidth or quantize_share or decode_cold or (test_attend and (avx512-int16 or fp16-avx512 or torch) and not novnni)" \
  >"$OUT/xeon_16t_bench.log" 2>&1; echo "bench exit $?"
tail -2 "$OUT/xeon_16t_bench.log"
echo "[$(el) s] end"
