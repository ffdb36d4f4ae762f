#!/usr/bin/env bash
# s12 device call 1: VAR 22 (= VAR 16 with the late sink/tail share from rolled code, attend.cuh ROLL) as the
# default, VAR 16 selectable (KVARN_ATTEND_VARIANT=16). Kernels prebuilt on the dev machine (nvcc 13.0.88,
# sm_90a + compute_90, -O3 -lineinfo) into .s12/ (md5s of every native/cuda source checked); there, the sm_90a
# SASS of the 24 existing kernels is identical to .s10's (VAR 22 is the one new function).
# Steps: build; pytest tests/test_cuda.py (default 22); outputs of VAR 16 vs 22 bit for bit (tests/test_cuda.py
# --dump and h200_s10_dump.py: k4v2 D 128 GQA 1/2/4, 1..9 splits); --sweep 0 15; memcheck + racecheck;
# alternating A/B 16 vs 22 (kvarn only); the full grid (copy bandwidth, SDPA); ncu of VAR 22 at 32K x 8
# (the s11 command, h200_s11_run1.sh) if time is left.
# (Ran on the tree with VAR 22 alone as the new code; both variants are now in h200_s12_var22_23.patch, not in
# native/cuda. run2.sh ran on the tree with the whole patch applied.)
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
md5sum -c --quiet .s12/src.md5 && echo "sources match .s12's library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s12/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
echo "[$(el) s] built"
timeout 100 python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test.log"
echo "[$(el) s] tested"
for v in 16 22; do
  KVARN_ATTEND_VARIANT=$v timeout 40 python3 tests/test_cuda.py --dump /tmp/t_v$v.npz | tail -1
  KVARN_ATTEND_VARIANT=$v timeout 60 python3 benchmarks/results/h200_s10_dump.py /tmp/d_v$v.npz | tail -1
done
timeout 40 python3 tests/test_cuda.py --dump /tmp/t_def.npz | tail -1
python3 - <<'PY' 2>&1 | tee -a "$OUT/test.log"
import numpy as np
for x, y in [("t_v16", "t_v22"), ("d_v16", "d_v22"), ("t_v22", "t_def")]:
    a, b = np.load(f"/tmp/{x}.npz"), np.load(f"/tmp/{y}.npz")
    assert sorted(a.files) == sorted(b.files)
    diff = [k for k in a.files if not np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))]
    n = sum(a[k].size for k in a.files)
    print(f"{x} vs {y}: {len(a.files) - len(diff)} of {len(a.files)} arrays ({n} values) bit-identical", diff[:10])
PY
echo "[$(el) s] compared"
timeout 45 python3 tests/test_cuda.py --sweep 0 15 2>&1 | tee "$OUT/sweep.log" | tail -4
echo "[$(el) s] swept"
for tool in memcheck racecheck; do
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >/tmp/san_$tool.log 2>&1
  echo "$tool: exit $? | $(tail -2 /tmp/san_$tool.log | tr '\n' ' ')" | tee -a "$OUT/test.log"
done
echo "[$(el) s] sanitized"
AB_POINTS=4096x1,4096x8,32768x8,131072x8 AB_VARIANTS="16 22 16 22 16 22" timeout 150 scripts/gpu_run.sh ab 2>&1 |
  grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
rm -rf "$OUT/ab"; rm -f "$OUT/env.log"
echo "[$(el) s] ab"
timeout 90 python3 benchmarks/bench_cuda.py --out /tmp/grid 2>&1 | tee "$OUT/bench_cuda.log" | grep -E "^\||copy"
cp /tmp/grid/bench_cuda*.json "$OUT/" 2>/dev/null
echo "[$(el) s] grid"
if [ "$(el)" -lt 360 ]; then
  SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats"
  KVARN_ATTEND_VARIANT=22 timeout 100 ncu --clock-control none --kernel-name regex:attend_kernel --launch-skip 1 --launch-count 1 \
    $SEC --section SourceCounters --warp-sampling-interval 0 --import-source yes -f -o /tmp/p22 \
    python3 benchmarks/bench_cuda.py --profile 32768x8 >/tmp/ncu22_run.log 2>&1 || { echo "ncu failed"; tail -5 /tmp/ncu22_run.log; }
  if [ -f /tmp/p22.ncu-rep ]; then
    ncu -i /tmp/p22.ncu-rep --page details >"$OUT/ncu22_details.txt" 2>&1
    ncu -i /tmp/p22.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/ncu22_sass.csv.gz"
    grep -E "attend_kernel|Duration|DRAM Throughput|Issued Ipc|Warp Cycles Per Issued|No Eligible|Registers Per" "$OUT/ncu22_details.txt" | head -10
  fi
fi
echo "[$(el) s] end"
