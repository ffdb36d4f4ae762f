#!/bin/bash
# Sixty-second session: append_attend_batch_step.py on cfb0948 (/tmp/site_f) and the leaner batch prologue
# (/tmp/site_f2), alternating, three rounds each; the same box.
cd /work/main/benchmarks/results/emr2c_s102
for r in 1 2 3; do
  for s in f f2; do
    echo "== site_$s round $r $(date -u +%H:%M:%S)"
    PYTHONPATH=/tmp/site_$s /tmp/kvarn-ci-venv/bin/python append_attend_batch_step.py
  done
done
