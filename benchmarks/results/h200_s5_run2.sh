#!/usr/bin/env bash
# s5 device call 2 (tree = HEAD + the s5 CUDA files, default = variant 7): build, pytest (default, and
# the attend tests with VAR 5 / VAR 6 forced), precision sweep, compute-sanitizer memcheck + racecheck.
set -uo pipefail
export PYTHONUNBUFFERED=1
scripts/gpu_run.sh build test 2>&1 | tail -6
for v in 5 6; do
  KVARN_ATTEND_VARIANT=$v python3 -m pytest -q tests/test_cuda.py -k "attend" 2>&1 | tail -2 | sed "s/^/VAR $v: /" | tee -a "$OUT/s5_test_forced.log"
done
SWEEP_SEEDS=15 scripts/gpu_run.sh sweep 2>&1 | tail -6
scripts/gpu_run.sh sanitize 2>&1 | grep -v "^$" | tail -8
obj=$(find build/gpu -name 'attend_d128.cu.o' | head -1)
cuobjdump -res-usage "$obj" 2>&1 | grep -A1 "ELi16ELi[4567]E" | grep -oE "ELi16ELi[4567]E|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+" | paste -sd' ' | tee "$OUT/s5_regs.log"
