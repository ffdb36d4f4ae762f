#!/usr/bin/env bash
# s9 device call 1 (exploratory): build (CUDA kernels prebuilt on the dev machine from this tree into
# .s9/libkvarn_cuda_kernels.a, nvcc 13.0, sm_90a + compute_90, -O3 -lineinfo; source md5s in .s9/src.md5
# checked here; native/cuda/CMakeLists.txt swapped for .s9/CMakeLists.prebuilt.txt in the device copy only),
# same-run A/B of VAR 16 (s8 default) / 20 (same-bit trims) / 21 (20 + split q.kz), kvarn only, alternating;
# then the attend tests and a 5-seed precision sweep with VAR 21 forced.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
md5sum -c --quiet .s9/src.md5 && echo "sources match the prebuilt library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s9/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "[$(el) s] built"
ab() { AB_POINTS=$1 AB_VARIANTS=$2 timeout $3 scripts/gpu_run.sh ab 2>&1 | grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'; rm -rf "$OUT/ab"; }
ab 4096x1,4096x8,32768x8,131072x8 "16 20 21 16 20 21 16 20 21" 150; mv "$OUT/ab.log" "$OUT/ab_run1.log"
echo "[$(el) s] ab"
KVARN_ATTEND_VARIANT=21 timeout 60 python3 -m pytest -q -x tests/test_cuda.py -k "attend or graph" 2>&1 | tail -3 | tee "$OUT/test_v21.log"
echo "[$(el) s] tested (VAR 21)"
KVARN_ATTEND_VARIANT=21 timeout 30 python3 tests/test_cuda.py --sweep 0 5 2>&1 | tee "$OUT/sweep_v21.log" | tail -5
echo "[$(el) s] end"
rm -f "$OUT/env.log"
