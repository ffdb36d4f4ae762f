#!/usr/bin/env bash
# s7 device call 1 (budget: ~2 min): build with the CUDA kernels prebuilt on the dev machine
# (.s7/libkvarn_cuda_kernels.a, same nvcc 13.0 and flags; the device copy's native/cuda/CMakeLists.txt
# is swapped for .s7/CMakeLists.prebuilt.txt -- device copy only), then Nsight Compute with source
# counters + warp-state sampling at 4K x 1 (served variant 9 = warp pairs), then a first A/B of
# v10 (= v9 with the second cluster barrier split: arrive after the DSMEM reads, wait before exit).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
snap() { tar czf /tmp/s7logs.tgz -C "$OUT" --exclude=logs.tgz --exclude='*.ncu-rep' . 2>/dev/null && mv /tmp/s7logs.tgz "$OUT/logs.tgz"; }
cp .s7/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
python3 -c 'import kvarn.cuda as kc; print("cuda available:", kc.is_available(), kc.unavailable_reason() or "")'
echo "[$(el) s] built"
timeout 75 ncu --clock-control none --kernel-name regex:attend_kernel --launch-skip 1 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section SchedulerStats \
  --warp-sampling-interval 0 --import-source yes -f -o "$OUT/p9" \
  python3 benchmarks/bench_cuda.py --profile 4096x1 >"$OUT/ncu_run.log" 2>&1 || { echo "ncu failed"; tail -5 "$OUT/ncu_run.log"; }
echo "[$(el) s] ncu done"
if [ -f "$OUT/p9.ncu-rep" ]; then
  ncu -i "$OUT/p9.ncu-rep" --page details >"$OUT/det9.txt" 2>&1
  ncu -i "$OUT/p9.ncu-rep" --page source --csv --print-source sass >"$OUT/sass9.csv" 2>&1
  ncu -i "$OUT/p9.ncu-rep" --page source --csv --print-source cuda >"$OUT/cuda9.csv" 2>&1
  [ $(stat -c %s "$OUT/sass9.csv") -lt 2000 ] && { head -5 "$OUT/sass9.csv"; ncu -i "$OUT/p9.ncu-rep" --page source --csv >"$OUT/sass9b.csv" 2>&1; }
  ls -la "$OUT"; grep -E "Duration|Elapsed Cycles|SM Active|Warp Cycles Per Issued|Issued Warp" "$OUT/det9.txt" | head
  [ $(stat -c %s "$OUT/p9.ncu-rep") -gt 15000000 ] && rm -f "$OUT/p9.ncu-rep"
fi
snap; echo "[$(el) s] exported"
if [ $(el) -lt 95 ]; then
  AB_POINTS=4096x1 AB_VARIANTS="9 10 9 10" timeout 45 scripts/gpu_run.sh ab 2>&1 | grep "ctx" |
    sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
  rm -rf "$OUT/ab"
fi
snap; echo "[$(el) s] end"
find "$OUT" -type f ! -name logs.tgz ! -name '*.ncu-rep' -delete; find "$OUT" -mindepth 1 -type d -empty -delete
