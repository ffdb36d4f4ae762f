#!/usr/bin/env bash
# Sixty-fourth session, device call (the lent Xeon, 16 vCPUs, CPU only: no GPU code changed): the pool's wake
# choice of cb57efc against the sixty-third session's (d026736, the tree in s64_old/, untracked, carried as is):
# CPU builds of both side by side, test_simd.py's pool and wake tests on the new one with avx2 and
# avx512 required, then wake_tax.py
# (attend after a 1.5 ms sleep, 16 threads) alternating old and new processes, ROUNDS rounds (default two).
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "avx512vbmi|avx512_vnni|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
build_site . /tmp/site_new & NEW=$!
build_site s64_old /tmp/site_old || exit 1
wait $NEW || exit 1
echo "[$(el) s] built"
KVARN_REQUIRE_ISAS=avx2,avx512 PYTHONPATH=/tmp/site_new timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py \
  -k "pool or wake" > "$OUT/test_simd.log" 2>&1
echo "test_simd rc $?"; tail -2 "$OUT/test_simd.log"; echo "[$(el) s] tests"
for r in $(seq "${ROUNDS:-2}"); do
  for site in old new; do
    echo "== round $r, $site"
    PYTHONPATH=/tmp/site_$site timeout 60 python3 benchmarks/results/emr2c_s104/wake_tax.py s 1024,131072 200
    PYTHONPATH=/tmp/site_$site timeout 60 python3 benchmarks/results/emr2c_s104/wake_tax.py h 32768,131072 200
  done
done 2>&1 | tee "$OUT/wake_tax_ab.log"
echo "[$(el) s] end"
