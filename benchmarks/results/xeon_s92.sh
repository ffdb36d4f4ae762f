#!/usr/bin/env bash
# Fifty-second session, device call s92 (the lent Xeon: AVX-512 + VNNI + AVX-VNNI + AMX, 16 vCPUs): the multi-token
# steps (kvarn_attend_tokens, kvarn.append_attend) on an Intel AVX-512 core, where the int8 cross-form tests that the
# Zen 4 skips (avx2's vpdpbusd form needs AVX-VNNI) run too: a CPU-only build of the working tree, the tests that
# exercise the kernels through the new path, then the multi-token benchmark at 16 threads. Timeouts keep the whole
# inside one 600 s call; partial logs come back.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; grep -o -E 'avx512_vnni|avx_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } \
  > "$OUT/machine.txt"
build_site . /tmp/site_s92 || exit 1
echo "[$(el) s] built"
export PYTHONPATH=/tmp/site_s92
python3 -c 'import kvarn; print(kvarn.__file__, kvarn.available_isas(), kvarn.active_isa())' | tee -a "$OUT/machine.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_append_attend.py tests/test_simd.py \
  > "$OUT/tests.log" 2>&1
echo "rc $?" >> "$OUT/tests.log"; tail -n 4 "$OUT/tests.log"; echo "[$(el) s] tests"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_CONTEXTS=1024,32768 KVARN_BENCH_TABLE="$OUT/steps_16t.md" \
  timeout 150 python3 -m pytest -q -p no:cacheprovider bench_attend.py -k multi_token > "$OUT/steps_16t.log" 2>&1
echo "rc $?" >> "$OUT/steps_16t.log"; grep -E "^## |^multi" "$OUT/steps_16t.md"; echo "[$(el) s] bench"
