#!/usr/bin/env bash
# s6 device call 2 (snapshot = HEAD + the s6 CUDA files, default now variant 9 = warp pairs at one
# record per warp): build, tests of the final build, same-run A/B (v7 = the s5 default, v9 = the new
# default, F = v9 + KVARN_ATTEND_FINISH=1: finish_states' weights once per head), the full grid,
# then checks of F (tests, sweep, sanitizers) -- time-boxed, in priority order. (KVARN_ATTEND_FINISH
# existed in this call's build only: no win, removed; the landed code has no such switch.)
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
snap() { tar czf /tmp/s6logs.tgz -C "$OUT" --exclude=logs.tgz . 2>/dev/null && mv /tmp/s6logs.tgz "$OUT/logs.tgz"; }
scripts/gpu_run.sh build 2>&1 | tail -2
snap; echo "[$(el) s] built"
timeout 90 python3 -m pytest -q -x tests/test_cuda.py 2>&1 | tail -2 | tee "$OUT/test_final.log"
timeout 60 python3 -m pytest -q -s tests/test_cuda.py -k "store or records_match" 2>&1 | grep -E "vs cpu" >"$OUT/store_vs_cpu.log"
echo "store vs cpu: $(grep -c '100.0000%' "$OUT/store_vs_cpu.log") of $(wc -l <"$OUT/store_vs_cpu.log") byte-identical"
KVARN_ATTEND_FINISH=1 timeout 60 python3 -m pytest -q tests/test_cuda.py -k attend 2>&1 | tail -1 | tee "$OUT/test_F.log"
snap; echo "[$(el) s] tested"
F=KVARN_ATTEND_FINISH=1
AB_POINTS=4096x1,4096x8,32768x8,131072x8 AB_VARIANTS="7 9 $F 7 9 $F" timeout 80 scripts/gpu_run.sh ab 2>&1 |
  grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//; s/KVARN_ATTEND_FINISH=1/F /'
rm -rf "$OUT/ab"; mv "$OUT/ab.log" "$OUT/ab1.log"
snap; echo "[$(el) s] ab1 done"
timeout 130 python3 benchmarks/bench_cuda.py --out "$OUT" 2>&1 | tee "$OUT/bench_cuda.log" | grep -E "^\||store|copy"
snap; echo "[$(el) s] grid done"
if [ $(el) -lt 215 ]; then
  AB_POINTS=4096x32,32768x1,32768x32,131072x1,131072x32 AB_VARIANTS="7 9 7 9" timeout 60 scripts/gpu_run.sh ab 2>&1 |
    grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
  rm -rf "$OUT/ab"
fi
snap; echo "[$(el) s] ab2 done"
if [ $(el) -lt 250 ]; then
  KVARN_ATTEND_FINISH=1 timeout 40 python3 tests/test_cuda.py --sweep 0 15 2>&1 | tee "$OUT/sweep_F.log" | tail -4
fi
for tool in racecheck memcheck; do
  [ $(el) -gt 265 ] && { echo "skip $tool F (time)"; continue; }
  KVARN_ATTEND_FINISH=1 timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_${tool}_F.log" 2>&1
  echo "$tool F: exit $? | $(tail -2 "$OUT/sanitize_${tool}_F.log" | tr '\n' ' ')"
done
snap; echo "[$(el) s] end"
find "$OUT" -type f ! -name logs.tgz -delete; find "$OUT" -mindepth 1 -type d -empty -delete
