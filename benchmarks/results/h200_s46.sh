#!/usr/bin/env bash
# Device call s46 (thirteenth session, after the preset and KVarNCache fixes): the whole suite on the Xeon + H200
# (cuda.py changed after s45: preset formats in messages and load_cpu, to_cpu keeping a custom Preset).
set -uo pipefail
source benchmarks/results/device_build.sh
echo "== whole suite"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -6 | tee "$OUT/suite.log"
echo "[$(el) s]"
echo "== memcheck: load_cpu / custom presets / cpu records on the GPU"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "full_tail or cpu_records_decode or custom_preset or records_match_cpu" >"$OUT/memcheck.log" 2>&1; echo "rc $?"; tail -3 "$OUT/memcheck.log"
echo "[$(el) s] end"
