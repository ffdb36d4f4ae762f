#!/usr/bin/env bash
# The one device run of the s4 work (fused merge + early q load), from the repository root, on the tree
# of 52dcd43 with h200_s4_fused_merge.patch applied (git apply; the patch was not landed):
# build, quick correctness, same-run A/B (old path = KVARN_ATTEND_FUSED=0,KVARN_ATTEND_QPF=0,
# i.e. separate merge kernel + q loaded after the tile state; new = both on, the default),
# a split-count exploration at 4K x 1, full pytest, precision sweep, sanitizers.
# Logs into $LOGS, packed into $OUT/logs.tgz after every step (a run cut short keeps what it has).
set -uo pipefail
LOGS=/tmp/s4logs
mkdir -p "$LOGS"
RET=$OUT  # as run on 2026-11-29, pack wrote "$OUT/logs.tgz" after OUT had been set to $LOGS, so no
          # logs came back (the results are the call's output tail: h200_s4_device_output.log); fixed here
pack() { tar czf "$RET/logs.tgz" -C "$LOGS" . 2>/dev/null; }
export PYTHONUNBUFFERED=1
export OUT=$LOGS
scripts/gpu_run.sh build 2>&1 | tail -6; pack
cuobjdump -res-usage "$(find build/gpu -name attend_d128.cu.o | head -1)" 2>&1 | grep -A1 "ELi16ELi4E\|merge" |
  grep -o "REG:[0-9]*\|STACK:[0-9]*\|LOCAL:[0-9]*" | paste -sd' ' | tee "$LOGS/regs.log"
python3 -m pytest -q -x tests/test_cuda.py -k "repeated or long_split or graph_capture or (matches_cpu and k4v2_g128 and 128)" \
  2>&1 | tail -3 | tee "$LOGS/quicktest.log"; pack
OLD="KVARN_ATTEND_FUSED=0,KVARN_ATTEND_QPF=0"; NEW="KVARN_ATTEND_FUSED=1,KVARN_ATTEND_QPF=1"
AB_POINTS=4096x1,4096x8,32768x8 AB_VARIANTS="$OLD $NEW $OLD $NEW" scripts/gpu_run.sh ab 2>&1 | grep -v "^$" | tail -14; pack
for n in 64 128; do
  KVARN_BENCH_MIN_PROGRAMS=$n python3 benchmarks/bench_cuda.py --kvarn-only --points 4096x1 --out "$LOGS/splits" --tag "_min$n" \
    2>&1 | grep "^ctx" | sed "s/^/min_programs=$n /" | tee -a "$LOGS/splits.log"
done; pack
python3 -m pytest -q -rs tests/test_cuda.py 2>&1 | tee "$LOGS/test_cuda.log" | tail -3; pack
SWEEP_SEEDS=15 scripts/gpu_run.sh sweep 2>&1 | tail -8; pack
scripts/gpu_run.sh sanitize 2>&1 | grep -v "^$" | tail -8; pack
