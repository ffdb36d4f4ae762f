#!/usr/bin/env bash
# Forty-eighth session, device call s88 (the forty-seventh session's unrun s87b plan): the CUDA build through the
# changed CMake (the configure-time assembler check for AVX-VNNI, the Windows refusal, the __linux__ guard), the whole
# suite over it with every ISA required (pytest-xdist; the whole log kept, skip reasons included), and the README's
# main job (kvarn demo) and kvarn info on that build.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"
build_cuda || exit 1
grep -h "KVARN_ASSEMBLER_KNOWS_AVX_VNNI" build/gpu/CMakeCache.txt >> "$OUT/machine.txt"
(cd /tmp && kvarn info && kvarn demo) > "$OUT/demo.log" 2>&1; echo "demo rc $?" >> "$OUT/demo.log"
tail -5 "$OUT/demo.log"; echo "[$(el) s] demo"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 480 python3 -m pytest -q -p no:cacheprovider -n 12 -rs tests > "$OUT/suite.log" 2>&1
echo "suite rc $?" >> "$OUT/suite.log"
tail -12 "$OUT/suite.log"
echo "[$(el) s] end"
