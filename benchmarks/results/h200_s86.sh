#!/usr/bin/env bash
# Forty-sixth session, device call s86: a regression run of the current tree on the lent machine (Xeon with
# AVX-512 VNNI + AVX-VNNI + AMX, and its GPU): the CUDA build, then the whole test suite there (every ISA's CPU tests
# on an Intel core with AVX-VNNI, which the Zen 4 development box lacks, and tests/test_cuda.py). The last whole-suite
# run there was s56 (2026-12-01); since then the avx512 kernels gained the int8 value weights, the
# centred int8 key codes, the split rule and the L2 prefetch. pytest-xdist spreads the suite when the machine has it.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/machine.txt"
build_cuda || exit 1
python3 -c 'import kvarn, kvarn.cuda as c; print(kvarn.available_isas(), kvarn.active_isa(), c.is_available())' | tee -a "$OUT/machine.txt"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 12"
echo "xdist: ${XDIST:-none}" | tee -a "$OUT/machine.txt"
timeout 440 python3 -m pytest -q -p no:cacheprovider -rs $XDIST tests >"$OUT/suite.log" 2>&1; rc=$?
echo "[$(el) s] suite rc $rc"; tail -15 "$OUT/suite.log"
