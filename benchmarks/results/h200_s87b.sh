#!/usr/bin/env bash
# Forty-seventh session, device call s87b: the CUDA build through the changed CMake (the configure-time assembler
# check for AVX-VNNI, the Windows refusal) and the whole suite over it with every ISA required (pytest-xdist).
# NOT RUN in the forty-seventh session: no device machine was lent for a second call. A plan for a later session.
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
grep -h "KVARN_ASSEMBLER_KNOWS_AVX_VNNI" build/gpu/CMakeCache.txt >> "$OUT/machine.txt"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 500 python3 -m pytest -q -p no:cacheprovider -n 12 -rs tests 2>&1 | tail -25 > "$OUT/suite.log"
tail -8 "$OUT/suite.log"
echo "[$(el) s] end"
