#!/usr/bin/env bash
# s9 device call 2 (meant as the final call of the tree with VAR 20 as default; VAR 20 was then not landed, see
# h200_s9_summary.md and h200_s9_var20.patch): build (CUDA kernels prebuilt on the dev
# machine from this tree: .s9/libkvarn_cuda_kernels.a, source md5s in .s9/src.md5 checked here), pytest,
# GPU-vs-CPU records, VAR 16 vs VAR 20 outputs compared bit for bit, precision sweep, memcheck + racecheck,
# same-run A/B (16 = s8 default, 20 = s9 default; kvarn only, alternating), the full bench grid, more A/B
# points. (A planned Nsight Compute run was dropped: a refused machine start cost 120 s of the budget.)
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
md5sum -c --quiet .s9/src.md5 && echo "sources match the prebuilt library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s9/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "[$(el) s] built"
timeout 90 python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test.log"
timeout 40 python3 -m pytest -q -s tests/test_cuda.py -k "store or records_match" 2>&1 | grep -E "vs cpu" >"$OUT/store_vs_cpu.log"
echo "store vs cpu: $(grep -c '100.0000%' "$OUT/store_vs_cpu.log") of $(wc -l <"$OUT/store_vs_cpu.log") cases byte-identical" | tee -a "$OUT/test.log"
for v in 16 20; do KVARN_ATTEND_VARIANT=$v timeout 40 python3 tests/test_cuda.py --dump /tmp/out_v$v.npz; done
python3 - <<'PY' 2>&1 | tee "$OUT/bits_16_vs_20.log"
import numpy as np
a, b = np.load("/tmp/out_v16.npz"), np.load("/tmp/out_v20.npz")
same = [k for k in a.files if np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))]
print(f"VAR 16 vs VAR 20 outputs: {len(same)} of {len(a.files)} arrays bit-identical", sorted(set(a.files) - set(same)))
PY
echo "[$(el) s] tested"
timeout 40 python3 tests/test_cuda.py --sweep 0 15 2>&1 | tee "$OUT/sweep.log" | tail -5
echo "[$(el) s] swept"
for tool in memcheck racecheck; do
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
  echo "$tool: exit $? | $(tail -2 "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
echo "[$(el) s] sanitized"
ab() { AB_POINTS=$1 AB_VARIANTS=$2 timeout $3 scripts/gpu_run.sh ab 2>&1 | grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'; rm -rf "$OUT/ab"; }
ab 4096x1,4096x8,32768x8,131072x8 "16 20 16 20 16 20" 120; mv "$OUT/ab.log" "$OUT/ab_main.log"
echo "[$(el) s] ab main"
timeout 60 python3 benchmarks/bench_cuda.py --out "$OUT" 2>&1 | tee "$OUT/bench_cuda.log" | grep -E "^\||store|copy"
echo "[$(el) s] grid"
ab 4096x32,32768x32 "16 20 16 20" 40; mv "$OUT/ab.log" "$OUT/ab_more.log"
echo "[$(el) s] ab more"
echo "[$(el) s] end"
rm -f "$OUT/env.log"
