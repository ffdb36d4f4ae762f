#!/usr/bin/env bash
# s6 device call 1 (run from the root of a snapshot = HEAD + the s6 CUDA files): build, tests of the
# warp-pair variant, same-run A/B, ncu at 4K x 1, sweep, sanitizers -- in priority order, each step
# time-boxed (the session's device budget allows one call).
#   v7 = the s5 default (VAR 5 at <= 1 record per warp, else VAR 6)
#   v9 = as v7, but pairs (VAR 8, a record shared by two warps) with twice the splits where a warp
#        would have one record (4K x 1: 4 -> 8 splits, 32 -> 64 CTAs)
#   v8 = pairs everywhere on the plan's splits (tests: multi-record pairs, merge kernel)
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
# at most 8 files come back: every log goes into $OUT/logs.tgz after each step
snap() { tar czf /tmp/s6logs.tgz -C "$OUT" --exclude=logs.tgz . 2>/dev/null && mv /tmp/s6logs.tgz "$OUT/logs.tgz"; }
scripts/gpu_run.sh build 2>&1 | tail -3
snap; echo "[$(el) s] built"
KVARN_ATTEND_VARIANT=9 timeout 120 python3 -m pytest -q -x tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test_v9.log"
KVARN_ATTEND_VARIANT=9 timeout 60 python3 -m pytest -q -s tests/test_cuda.py -k "store or records_match" 2>&1 | grep -E "vs cpu" >"$OUT/store_vs_cpu.log"
echo "store vs cpu: $(grep -c '100.0000%' "$OUT/store_vs_cpu.log") of $(wc -l <"$OUT/store_vs_cpu.log") byte-identical"
snap; echo "[$(el) s] tested v9"
AB_POINTS=4096x1,4096x8,32768x8,131072x8 AB_VARIANTS="7 9 8 7 9" timeout 150 scripts/gpu_run.sh ab 2>&1 |
  grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
rm -rf "$OUT/ab"
snap; echo "[$(el) s] ab done"
for v in 7 9; do
  KVARN_ATTEND_VARIANT=$v timeout 60 ncu --clock-control none --kernel-name regex:attend_kernel --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats \
    python3 benchmarks/bench_cuda.py --profile 4096x1 >"$OUT/ncu_4k1_v$v.log" 2>&1 || echo "ncu v$v failed"
  echo "ncu v$v:"; grep -E "Duration|Elapsed Cycles|SM Active|Grid Size|Cluster Size|Registers|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per" "$OUT/ncu_4k1_v$v.log" | head -14
done
snap; echo "[$(el) s] ncu done"
KVARN_ATTEND_VARIANT=8 timeout 90 python3 -m pytest -q tests/test_cuda.py -k attend 2>&1 | tail -2 | tee "$OUT/test_v8.log"
snap; echo "[$(el) s] tested v8"
KVARN_ATTEND_VARIANT=9 timeout 60 python3 tests/test_cuda.py --sweep 0 15 2>&1 | tee "$OUT/sweep_v9.log" | tail -5
snap; echo "[$(el) s] swept"
for tool in memcheck racecheck; do
  for v in 9 8; do
    [ $(el) -gt 350 ] && { echo "skip $tool v$v (time)"; continue; }
    KVARN_ATTEND_VARIANT=$v timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_${tool}_v$v.log" 2>&1
    echo "$tool v$v: exit $? | $(tail -2 "$OUT/sanitize_${tool}_v$v.log" | tr '\n' ' ')"
  done
done
snap; echo "[$(el) s] end"
find "$OUT" -type f ! -name logs.tgz -delete; find "$OUT" -mindepth 1 -type d -empty -delete
