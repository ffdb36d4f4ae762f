#!/usr/bin/env bash
# Forty-fifth session, device call s85d: short_threads.py (results/xeon_h100_s85d/) on the lent Xeon, CPU-only build.
# Not run in the forty-fifth session (two tries found no machine); run in the forty-sixth, 2026-12-05 17:40 UTC
# (log: results/xeon_h100_s85d/short_threads.log; RESULTS §2 "Forty-sixth session").
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_site . /tmp/site_new || exit 1
echo "[$(el) s] built"
PYTHONPATH=/tmp/site_new timeout 300 python3 benchmarks/results/xeon_h100_s85d/short_threads.py 2>&1 | tee "$OUT/short_threads.log"
echo "[$(el) s] done"
