#!/usr/bin/env bash
# Device calls s63 (twenty-third session), on the Xeon + H200. Step "gpu": the CUDA build with the attend launch
# memos keyed by device, test_cuda.py, compute-sanitizer memcheck / racecheck. Step "bench": the full grid of
# bench_cuda.py (4K / 32K / 128K x batch 1 / 8 / 32, the store benchmark) on the current kernels - last run whole in
# s8, before s51's kernel change (a report-only audit's point). Then, after that grid's kvarn output check failed at
# 128K x 8 / 32: "accuracy" (a float64 probe), "offset" (the same with KVARN_OFFSET_CODES 0, which the served loops do
# not take), "bench2" (the grid with the weighted check), "variant" (the row-split loop with and without offset
# codes), "pv" (KVARN_SWAPPED_PV_OFFSET 0 against 1: tests, precision, speed A/B), "pvdefine" (that via cmake.define).
set -uo pipefail
. benchmarks/results/device_prologue.sh
[ "${1:-gpu}" = pvdefine ] || build_cuda || exit 1  # pvdefine builds its own
if [ "${1:-gpu}" = gpu ]; then
  python3 -c "import kvarn, kvarn.cuda as kc; print(kvarn.available_isas(), kvarn.active_isa(), kc.is_available())" | tee "$OUT/machine.txt"
  nvcc --version | tail -1 | tee -a "$OUT/machine.txt"
  timeout 300 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_cuda.py --tb=short 2>&1 \
    | grep -E "^(FAILED|SKIPPED|E |tests/test_cuda.py:[0-9]+:|[0-9]+ (passed|failed))" | tail -30 | tee "$OUT/test_cuda.log"
  echo "[$(el) s] test_cuda"
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
    echo "$tool: exit $? | $(tail -2 "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
  done
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = bench ]; then
  timeout 540 python3 benchmarks/bench_cuda.py --out "$OUT" >"$OUT/bench_full.log" 2>&1
  echo "bench exit $?"; grep -E "copy|^store|^\| *[0-9]" "$OUT/bench_full.log" | head -30
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = accuracy ]; then  # s63b: the full grid's 128K output checks, against a float64 oracle
  timeout 500 python3 benchmarks/results/s63_gpu_long_accuracy.py 2>&1 | grep -v Warning | tee "$OUT/long_accuracy.log"
  echo "[$(el) s] end"
fi
# s63c ran an earlier "offset" step: the tree built to /tmp/site_nooff with -C build-dir=/tmp/build_nooff
# -C cmake.define.CMAKE_CUDA_FLAGS=-DKVARN_OFFSET_CODES=0, the probe with PYTHONPATH=/tmp/site_nooff, then two rounds of
# `bench_cuda.py --kvarn-only --points 4096x1,32768x8,131072x8,131072x32 --out /tmp` with each build (logs
# h200_s63/s63c_cmakedefine_ab_*; the switch does not reach the served loops, so both builds ran the same arithmetic).
if [ "${1:-gpu}" = offset ]; then  # s63d: the probe with the offset codes compiled out (KVARN_OFFSET_CODES 0 in a copy)
  rm -rf /tmp/src_nooff && mkdir -p /tmp/src_nooff && cp -r CMakeLists.txt pyproject.toml README.md LICENSE include native src /tmp/src_nooff/
  sed -i 's/^#define KVARN_OFFSET_CODES 1$/#define KVARN_OFFSET_CODES 0/' /tmp/src_nooff/native/cuda/attend.cuh
  grep -c "^#define KVARN_OFFSET_CODES 0$" /tmp/src_nooff/native/cuda/attend.cuh
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_nooff \
    -C build-dir=/tmp/build_nooff2 /tmp/src_nooff >"$OUT/build_nooff.log" 2>&1 || { tail -30 "$OUT/build_nooff.log"; exit 1; }
  echo "[$(el) s] built the variant"
  timeout 200 python3 benchmarks/results/s63_gpu_long_accuracy.py 2>&1 | grep -v Warning | tee "$OUT/long_accuracy.log"
  echo "[$(el) s] probe, default"
  PYTHONPATH=/tmp/site_nooff timeout 200 python3 benchmarks/results/s63_gpu_long_accuracy.py 2>&1 | grep -v Warning \
    | tee "$OUT/long_accuracy_nooff.log"
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = bench2 ]; then  # s63e: the full grid again, its kvarn check now against the float64 oracle (weighted)
  timeout 540 python3 benchmarks/bench_cuda.py --out "$OUT" >"$OUT/bench_full.log" 2>&1
  echo "bench exit $?"; grep -E "copy|^store|^\| *[0-9]|FAILED" "$OUT/bench_full.log" | head -30
  grep -E "check: kvarn" "$OUT/bench_full.log" | sed 's/; vs CPU.*|out|/ |out|/'
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = variant ]; then  # s63f: the served k4v2 loops hard-code the offset arithmetic; the row-split loop
  # (KVARN_ATTEND_VARIANT=1) takes KVARN_OFFSET_CODES: offset codes (default build) vs HSUB2 (a copy built with 0)
  rm -rf /tmp/src_nooff && mkdir -p /tmp/src_nooff && cp -r CMakeLists.txt pyproject.toml README.md LICENSE include native src /tmp/src_nooff/
  sed -i 's/^#define KVARN_OFFSET_CODES 1$/#define KVARN_OFFSET_CODES 0/' /tmp/src_nooff/native/cuda/attend.cuh
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_nooff \
    -C build-dir=/tmp/build_nooff2 /tmp/src_nooff >"$OUT/build_nooff.log" 2>&1 || { tail -30 "$OUT/build_nooff.log"; exit 1; }
  echo "[$(el) s] built the variant"
  for v in 16 1; do
    echo "== default build, KVARN_ATTEND_VARIANT=$v"
    KVARN_ATTEND_VARIANT=$v timeout 120 python3 benchmarks/results/s63_gpu_long_accuracy.py quick 2>&1 | grep -v Warning | tee "$OUT/variant_${v}_offset.log"
  done
  echo "== KVARN_OFFSET_CODES 0 build, KVARN_ATTEND_VARIANT=1"
  KVARN_ATTEND_VARIANT=1 PYTHONPATH=/tmp/site_nooff timeout 120 python3 benchmarks/results/s63_gpu_long_accuracy.py quick 2>&1 | grep -v Warning | tee "$OUT/variant_1_hsub2.log"
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = pv ]; then  # s63g: the swapped loops' P.V product on HSUB2 codes (KVARN_SWAPPED_PV_OFFSET 0) against
  # the offset codes (1, the old arithmetic): tests, precision, speed A/B. As run (s63g) the tree's default was 0 and
  # the copy got 1 by this sed; the default is 1 since (1b07e19), so a rerun at HEAD compares two builds of 1 -
  # swap the sed's 0 and 1 (and the "new"/"old" roles) to rerun it
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_cuda.py --tb=short 2>&1 \
    | grep -E "^(FAILED|E |[0-9]+ (passed|failed))" | tail -12 | tee "$OUT/test_cuda.log"
  echo "[$(el) s] test_cuda"
  rm -rf /tmp/src_old && mkdir -p /tmp/src_old && cp -r CMakeLists.txt pyproject.toml README.md LICENSE include native src /tmp/src_old/
  sed -i 's/^#define KVARN_SWAPPED_PV_OFFSET 0$/#define KVARN_SWAPPED_PV_OFFSET 1/' /tmp/src_old/native/cuda/attend.cuh
  grep -c "^#define KVARN_SWAPPED_PV_OFFSET 1$" /tmp/src_old/native/cuda/attend.cuh || exit 1
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_old \
    -C build-dir=/tmp/build_old /tmp/src_old >"$OUT/build_old.log" 2>&1 || { tail -30 "$OUT/build_old.log"; exit 1; }
  echo "[$(el) s] built the old arithmetic"
  echo "== new (HSUB2 P.V)"; timeout 120 python3 benchmarks/results/s63_gpu_long_accuracy.py quick 2>&1 | grep -v Warning | tee "$OUT/pv_new_accuracy.log"
  echo "== old (offset P.V)"; PYTHONPATH=/tmp/site_old timeout 120 python3 benchmarks/results/s63_gpu_long_accuracy.py quick 2>&1 | grep -v Warning | tee "$OUT/pv_old_accuracy.log"
  echo "[$(el) s] probes"
  for round in 1 2 3; do
    for build in new old; do
      pp=""; [ $build = old ] && pp=/tmp/site_old
      PYTHONPATH=$pp timeout 100 python3 benchmarks/bench_cuda.py --kvarn-only --points 4096x1,4096x8,32768x1,32768x8,131072x8,131072x32 \
        --out /tmp >"$OUT/pv_ab_${build}_$round.log" 2>&1
      echo "$build round $round exit $?: $(grep -E '^ctx' "$OUT/pv_ab_${build}_$round.log" | sed 's/(eager.*//' | awk '{print $2"x"$4" "$6}' | tr '\n' ' ')"
    done
  done
  echo "[$(el) s] A/B"
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/pv_sanitize_$tool.log" 2>&1
    echo "$tool: exit $? | $(tail -2 "$OUT/pv_sanitize_$tool.log" | tr '\n' ' ')"
  done
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = pvdefine ]; then  # s63h: default back to the offset arithmetic (speed); the HSUB2 P.V as a build-time define
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_def \
    -C build-dir=/tmp/build_def -C cmake.define.CMAKE_CUDA_FLAGS=-DKVARN_SWAPPED_PV_OFFSET=0 . >"$OUT/build_def.log" 2>&1 \
    || { tail -30 "$OUT/build_def.log"; exit 1; }
  echo "[$(el) s] built with the define"
  PYTHONPATH=/tmp/site_def timeout 100 python3 benchmarks/results/s63_gpu_long_accuracy.py quick 2>&1 | grep -v Warning | tail -4
  echo "[$(el) s] end"
fi
