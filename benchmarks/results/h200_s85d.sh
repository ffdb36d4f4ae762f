#!/usr/bin/env bash
# Forty-fifth session, device call s85d: short_threads.py (results/xeon_h100_s85d/) on the lent Xeon, CPU-only build.
# NOT RUN: two tries found no machine (12:06, 12:16 UTC) and the session's device time ran out; for a later session.
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_site . /tmp/site_new || exit 1
echo "[$(el) s] built"
PYTHONPATH=/tmp/site_new timeout 300 python3 benchmarks/results/xeon_h100_s85d/short_threads.py 2>&1 | tee "$OUT/short_threads.log"
echo "[$(el) s] done"
