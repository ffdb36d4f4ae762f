#!/usr/bin/env bash
# Sixtieth session, device call s100c (same lease): the whole suite on the lent host's Xeon with every ISA required
# (its AVX-VNNI forms of the avx2 int kernels are tested nowhere else: the Emerald Rapids VM hides AVX-VNNI), over
# the CUDA build of s100b, with its transformers.
set -uo pipefail
. benchmarks/results/device_prologue.sh
record_machine
build_cuda || exit 1
python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee -a "$OUT/machine.txt"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 280 python3 -m pytest -q -rs -n 12 -p no:cacheprovider tests/ > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "^FAILED|^ERROR" "$OUT/suite.log" | head; tail -8 "$OUT/suite.log"; echo "[$(el) s] end"
