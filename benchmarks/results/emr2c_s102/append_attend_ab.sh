#!/bin/bash
# Sixty-second session: append_attend_step.py on b3cf002 (/tmp/site_b) and the one-token path (/tmp/site_f),
# alternating, three rounds each; the same box.
cd /work/main/benchmarks/results/emr2c_s102
for r in 1 2 3; do
  for s in b f; do
    echo "== site_$s round $r $(date -u +%H:%M:%S)"
    PYTHONPATH=/tmp/site_$s /tmp/kvarn-ci-venv/bin/python append_attend_step.py
  done
done
