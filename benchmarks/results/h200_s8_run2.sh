#!/usr/bin/env bash
# s8 device call 2: build (prebuilt CUDA kernels, as call 1), same-run A/B of the tile-loop options on the late
# sink/tail path (12 = s7 default, 13 = VAR 6 -> attend_early late order + push merge + FAST, 16 = 13 + NODIV,
# 17 = 13 + DYN tile claims, 18 = 16 + sink/tail before the tiles' barrier, 19 = 17 + that), correctness of the
# candidates (pytest, sweep), and an ncu source-counter profile of 19 at 32K x 8.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
cp .s8/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
ab() { AB_POINTS=$1 AB_VARIANTS=$2 timeout $3 scripts/gpu_run.sh ab 2>&1 | grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'; rm -rf "$OUT/ab"; }
ab 32768x8,4096x8,131072x8 "12 13 16 17 18 19 12 13 16 17 18 19" 200
mv "$OUT/ab.log" "$OUT/ab2.log"
echo "[$(el) s] ab done"
for v in 19 17; do
  KVARN_ATTEND_VARIANT=$v timeout 60 python3 -m pytest -q -x tests/test_cuda.py -k "attend or graph" 2>&1 | tail -2 | sed "s/^/v$v pytest: /" | tee -a "$OUT/checks2.log"
  KVARN_ATTEND_VARIANT=$v timeout 40 python3 tests/test_cuda.py --sweep 0 6 2>&1 | tail -5 | sed "s/^/v$v sweep: /" | tee -a "$OUT/checks2.log"
  echo "[$(el) s] v$v checked"
done
mkdir -p "$OUT/p"
KVARN_ATTEND_VARIANT=19 timeout 60 ncu --clock-control none --kernel-name regex:attend_kernel --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --warp-sampling-interval 0 \
  -f -o /tmp/p19 python3 benchmarks/bench_cuda.py --profile 32768x8 >"$OUT/p/ncu19_run.log" 2>&1 || echo "ncu 19 failed"
if [ -f /tmp/p19.ncu-rep ]; then
  ncu -i /tmp/p19.ncu-rep --page details >"$OUT/p/det19.txt" 2>&1
  ncu -i /tmp/p19.ncu-rep --page source --csv --print-source sass >"$OUT/p/sass19.csv" 2>&1
fi
tar czf "$OUT/prof2.tgz" -C "$OUT" p && rm -rf "$OUT/p"
echo "[$(el) s] end"
rm -f "$OUT/env.log"
