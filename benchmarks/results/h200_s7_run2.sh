#!/usr/bin/env bash
# s7 device call 2 (budget: ~2.5 min): build (CUDA kernels prebuilt on the dev machine, as in call 1),
# same-run A/B (kvarn only, alternating processes, one binary): v9 = the s6 default (VAR 8 pairs),
# v11 = pairs + push_merge epilogue, v12 = v11 + vector q loads + batched sink/tail score reductions
# (the build's default); then the checks on the default (12): pytest, precision sweep, memcheck,
# racecheck; last, if time is left, one full bench point (4K x 1 with SDPA in the same process).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
snap() { tar czf /tmp/s7logs.tgz -C "$OUT" --exclude=logs.tgz . 2>/dev/null && mv /tmp/s7logs.tgz "$OUT/logs.tgz"; }
cp .s7/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
ab() { AB_POINTS=$1 AB_VARIANTS=$2 timeout $3 scripts/gpu_run.sh ab 2>&1 | grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'; rm -rf "$OUT/ab"; }
ab 4096x1 "9 11 12 9 11 12" 50; mv "$OUT/ab.log" "$OUT/ab_4k1.log"
snap; echo "[$(el) s] ab 4K x 1 done"
timeout 45 python3 -m pytest -q -x tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test.log"
snap; echo "[$(el) s] pytest done"
ab 4096x8,32768x8,131072x8 "9 12" 40; mv "$OUT/ab.log" "$OUT/ab_other.log"
snap; echo "[$(el) s] ab others done"
timeout 30 python3 tests/test_cuda.py --sweep 0 15 2>&1 | tee "$OUT/sweep.log" | tail -5
snap; echo "[$(el) s] swept"
for tool in memcheck racecheck; do
  [ $(el) -gt 135 ] && { echo "skip $tool (time)"; continue; }
  timeout 35 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
  echo "$tool: exit $? | $(tail -2 "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
snap; echo "[$(el) s] sanitized"
if [ $(el) -lt 140 ]; then
  timeout 25 python3 benchmarks/bench_cuda.py --points 4096x1 --out "$OUT" 2>&1 | grep -E "ctx|copy|^\|" | tee "$OUT/bench_4k1.log"
fi
snap; echo "[$(el) s] end"
find "$OUT" -type f ! -name logs.tgz -delete; find "$OUT" -mindepth 1 -type d -empty -delete
