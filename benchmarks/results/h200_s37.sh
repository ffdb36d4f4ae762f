#!/usr/bin/env bash
# Device call s37 (twelfth session, final): the whole suite on the Xeon + H200 with this session's code;
# the CUDA workload under compute-sanitizer (memcheck, racecheck) with the plan-owned split states;
# host time to issue calls, previous cuda.py vs this one.
set -uo pipefail
source benchmarks/results/device_build.sh
echo "== whole suite"
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs -x tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s]"
echo "== host time to issue calls, previous vs new"
timeout 200 python3 .s15/host_ab2.py 2>&1 | tee "$OUT/host_ab2.log"
echo "[$(el) s]"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool"
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
  echo "rc $?"; tail -3 "$OUT/sanitize_$tool.log"
  echo "[$(el) s]"
done
echo "[$(el) s] end"
