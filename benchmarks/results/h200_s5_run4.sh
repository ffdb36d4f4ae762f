#!/usr/bin/env bash
# s5 device call 5: after the single-split rule (direct path at splits = 1 only for <= 64 tiles per
# split): rebuild, pytest, A/B against the s5 baseline (v4) at the B 32 points and 4K x 1.
set -uo pipefail
export PYTHONUNBUFFERED=1
scripts/gpu_run.sh build 2>&1 | tail -2
python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -1
AB_POINTS=32768x32,4096x32,4096x1,32768x8 AB_VARIANTS="4 7 4 7" scripts/gpu_run.sh ab 2>&1 | grep "ctx" |
  sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
