#!/usr/bin/env bash
# s8 device call 4 (final, the code as committed): build (CUDA kernels prebuilt on the dev machine from this
# tree: .s8/libkvarn_cuda_kernels.a, source md5s in .s8/src.md5 checked here), pytest, GPU-vs-CPU records,
# precision sweep, memcheck + racecheck, same-run A/B (12 = s7 default, 16 = s8 default; kvarn only,
# alternating processes), the full bench grid, then more A/B points (VAR 6 now serves > 8 splits).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
md5sum -c --quiet .s8/src.md5 && echo "sources match the prebuilt library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s8/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "[$(el) s] built"
timeout 80 python3 -m pytest -q -x tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test.log"
timeout 40 python3 -m pytest -q -s tests/test_cuda.py -k "store or records_match" 2>&1 | grep -E "vs cpu" >"$OUT/store_vs_cpu.log"
echo "store vs cpu: $(grep -c '100.0000%' "$OUT/store_vs_cpu.log") of $(wc -l <"$OUT/store_vs_cpu.log") cases byte-identical" | tee -a "$OUT/test.log"
echo "[$(el) s] tested"
timeout 40 python3 tests/test_cuda.py --sweep 0 15 2>&1 | tee "$OUT/sweep.log" | tail -5
echo "[$(el) s] swept"
for tool in memcheck racecheck; do
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
  echo "$tool: exit $? | $(tail -2 "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
echo "[$(el) s] sanitized"
ab() { AB_POINTS=$1 AB_VARIANTS=$2 timeout $3 scripts/gpu_run.sh ab 2>&1 | grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'; rm -rf "$OUT/ab"; }
ab 4096x1,4096x8,32768x8,131072x8 "12 16 12 16 12 16" 120; mv "$OUT/ab.log" "$OUT/ab_main.log"
echo "[$(el) s] ab main"
timeout 140 python3 benchmarks/bench_cuda.py --out "$OUT" 2>&1 | tee "$OUT/bench_cuda.log" | grep -E "^\||store|copy"
echo "[$(el) s] grid"
ab 32768x1,131072x1,4096x32,32768x32 "12 16 12 16" 110; mv "$OUT/ab.log" "$OUT/ab_more.log"
echo "[$(el) s] end"
rm -f "$OUT/env.log"
tar czf /tmp/s8logs.tgz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/s8logs.tgz "$OUT/logs.tgz"
