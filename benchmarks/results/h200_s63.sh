#!/usr/bin/env bash
# Device calls s63 (twenty-third session), on the Xeon + H200. Step "gpu": the CUDA build with the attend launch
# memos keyed by device, test_cuda.py, compute-sanitizer memcheck / racecheck. Step "bench": the full grid of
# bench_cuda.py (4K / 32K / 128K x batch 1 / 8 / 32, the store benchmark) on the current kernels - last run whole in
# s8, before s51's kernel change (a report-only audit's point).
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_cuda || exit 1
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
if [ "${1:-gpu}" = offset ]; then  # s63c/d: the probe with the offset codes compiled out (KVARN_OFFSET_CODES 0 in a copy)
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
