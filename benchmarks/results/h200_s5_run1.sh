#!/usr/bin/env bash
# s5 device call 1 (from the root of a tree = HEAD + the s5 CUDA files): build, pytest, then a
# same-run A/B of the attend paths, kvarn only, alternating processes (same binary):
#   base  = KVARN_ATTEND_VARIANT=4 (swapped tiles, previous prologue), merge kernel   (= HEAD's kernel)
#   early = VAR 5 (early sink/tail + shuffle q rotation), merge kernel
#   both  = VAR 5 + direct path (cluster merge in shared memory, no merge kernel)   (the new default)
set -uo pipefail
export PYTHONUNBUFFERED=1
scripts/gpu_run.sh build 2>&1 | tail -4
python3 -m pytest -q -x tests/test_cuda.py 2>&1 | tail -4 | tee "$OUT/s5_test1.log"
B="KVARN_ATTEND_VARIANT=4,KVARN_ATTEND_DIRECT=0"; E="KVARN_ATTEND_VARIANT=5,KVARN_ATTEND_DIRECT=0"; N="KVARN_ATTEND_VARIANT=5,KVARN_ATTEND_DIRECT=1"
AB_POINTS=4096x1,4096x8,32768x8,131072x8,4096x32 AB_VARIANTS="$B $E $N $B $E $N" scripts/gpu_run.sh ab 2>&1 |
  grep "ctx" | sed -E 's/KVARN_ATTEND_VARIANT=//; s/,KVARN_ATTEND_DIRECT=/ d/; s/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
