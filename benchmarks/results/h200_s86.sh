#!/usr/bin/env bash
# Forty-sixth session, device call s86: a regression run of the current tree on the lent machine (Xeon with
# AVX-512 VNNI + AVX-VNNI + AMX, and its GPU): the CUDA build, then the whole test suite there (every ISA's CPU tests
# on an Intel core with AVX-VNNI, which the Zen 4 development box lacks, and tests/test_cuda.py), pytest-xdist spreading
# it where the machine has it. (A repeat, as it turned out: the forty-fourth session's s84 ran the same tree's suite.)
# For a rerun: h200_s84.sh's suite step, which also sets KVARN_REQUIRE_ISAS=avx2,avx512 (this one did not; its
# machine.txt shows all three ISAs present), plus -n 12 where pytest-xdist is installed.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/machine.txt"
build_cuda || exit 1
python3 -c 'import kvarn, kvarn.cuda as c; print(kvarn.available_isas(), kvarn.active_isa(), c.is_available())' | tee -a "$OUT/machine.txt"
XDIST=""; python3 -c "import xdist" 2>/dev/null && XDIST="-n 12"
echo "xdist: ${XDIST:-none}" | tee -a "$OUT/machine.txt"
timeout 440 python3 -m pytest -q -p no:cacheprovider -rs $XDIST tests >"$OUT/suite.log" 2>&1; rc=$?
echo "[$(el) s] suite rc $rc"; tail -15 "$OUT/suite.log"
