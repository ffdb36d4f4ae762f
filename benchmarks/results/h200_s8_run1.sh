#!/usr/bin/env bash
# s8 device call 1: build (CUDA kernels prebuilt on the dev machine: .s8/libkvarn_cuda_kernels.a, nvcc 13.0,
# sm_90a + compute_90, -O3 -lineinfo; native/cuda/CMakeLists.txt swapped for .s8/CMakeLists.prebuilt.txt in
# the device copy only), Nsight Compute at 32K x 8 of the s7 default (KVARN_ATTEND_VARIANT=12 -> VAR 6 there)
# with source counters, a lighter one of VAR 13, SASS + line info of the kernels, then a same-run A/B.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
cp .s8/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
python3 -c 'import kvarn.cuda as kc; print("cuda available:", kc.is_available(), kc.unavailable_reason() or "")'
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
echo "[$(el) s] built"
mkdir -p "$OUT/p"
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats"
KVARN_ATTEND_VARIANT=12 timeout 100 ncu --clock-control none --kernel-name regex:attend_kernel --launch-skip 1 --launch-count 1 \
  $SEC --section SourceCounters --warp-sampling-interval 0 --import-source yes -f -o /tmp/p12 \
  python3 benchmarks/bench_cuda.py --profile 32768x8 >"$OUT/p/ncu12_run.log" 2>&1 || { echo "ncu 12 failed"; tail -5 "$OUT/p/ncu12_run.log"; }
echo "[$(el) s] ncu 12 done"
if [ -f /tmp/p12.ncu-rep ]; then
  ncu -i /tmp/p12.ncu-rep --page details >"$OUT/p/det12.txt" 2>&1
  ncu -i /tmp/p12.ncu-rep --page source --csv --print-source sass >"$OUT/p/sass12.csv" 2>&1
fi
KVARN_ATTEND_VARIANT=13 timeout 60 ncu --clock-control none --kernel-name regex:attend_kernel --launch-skip 1 --launch-count 1 \
  $SEC -f -o /tmp/p13 python3 benchmarks/bench_cuda.py --profile 32768x8 >"$OUT/p/ncu13_run.log" 2>&1 || echo "ncu 13 failed"
[ -f /tmp/p13.ncu-rep ] && ncu -i /tmp/p13.ncu-rep --page details >"$OUT/p/det13.txt" 2>&1
echo "[$(el) s] ncu 13 done"
grep -E "Duration|DRAM Throughput|L2 Hit|Issued Ipc|Warp Cycles Per Issued|No Eligible|Registers Per|Achieved Occ" "$OUT/p/det12.txt" "$OUT/p/det13.txt" | head -30
( cd /tmp && mkdir -p cub && cd cub && cuobjdump -xelf all "$OLDPWD/.s8/libkvarn_cuda_kernels.a" >/dev/null 2>&1; f=$(ls | grep -i d128 | head -1); echo "cubin: $f"; nvdisasm -g -gi -c "$f" >"$OUT/p/d128.sass" 2>&1 || cuobjdump -sass "$f" >"$OUT/p/d128.sass" )
tar czf "$OUT/prof.tgz" -C "$OUT" p && rm -rf "$OUT/p"
echo "[$(el) s] profiles packed"
ab() { AB_POINTS=$1 AB_VARIANTS=$2 timeout $3 scripts/gpu_run.sh ab 2>&1 | grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'; rm -rf "$OUT/ab"; }
ab 32768x8,4096x8,131072x8,4096x1 "12 13 15 12 13 15" 200
echo "[$(el) s] end"
rm -f "$OUT/env.log"
