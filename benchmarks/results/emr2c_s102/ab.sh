#!/bin/bash
# Sixty-second session: ab.sh SCRIPT SITE... runs SCRIPT (in this directory) under each site directory's build
# in turn, three rounds. Ran as: ab.sh append_attend_step.py /tmp/site_b /tmp/site_f (b3cf002 against cfb0948;
# append_attend_ab.log) and ab.sh append_attend_batch_step.py /tmp/site_f /tmp/site_f2 (cfb0948 against
# 62b3df4; append_attend_batch_ab.log, then again append_attend_batch_ab2.log). The logs came from the two
# scripts' own copies of per_step and of this loop (the same code; step_timing.py and ab.sh since).
cd "$(dirname "$0")"
script=$1; shift
for r in 1 2 3; do
  for s in "$@"; do
    echo "== $(basename $s) round $r $(date -u +%H:%M:%S)"
    PYTHONPATH=$s /tmp/kvarn-ci-venv/bin/python "$script"
  done
done
