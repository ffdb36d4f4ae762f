#!/usr/bin/env bash
# Sixty-first session, device call s101: the avx512 kernels' VBMI layouts (828ec82, 0c53c77) on the lent Xeon. Its
# CPU build (no CUDA: no GPU code changed); test_simd.py with avx2 and avx512 required (the VBMI and VNNI form
# pairs' bit-identity, every kernel against scalar); one-thread per-record A/B with VBMI on and off, alternating
# processes; the 32K b1 target rows on 16 threads (the #3 command of RESULTS section 2).
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "avx512vbmi|avx512_vnni|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > "$OUT/machine.txt"
cat "$OUT/machine.txt"
build_site . /tmp/site_new || exit 1
echo "[$(el) s] built"
KVARN_REQUIRE_ISAS=avx2,avx512 PYTHONPATH=/tmp/site_new timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py \
  > "$OUT/test_simd.log" 2>&1
echo "test_simd rc $?"; tail -2 "$OUT/test_simd.log"; echo "[$(el) s] tests"
PYTHONPATH=/tmp/site_new python3 -c "from kvarn import _native; import kvarn; print('vbmi', _native.cpu_has_vbmi(), _native.vbmi(), kvarn.active_isa())"
for shape in "9 3 64" "32 8 128"; do
  for r in 1 2; do
    for e in on off; do
      if [ $e = on ]; then pre="env -u S61_NOVBMI"; else pre="env S61_NOVBMI=1"; fi
      echo "vbmi $e, Hq/Hk/D $shape, pair $r: $($pre PYTHONPATH=/tmp/site_new python3 benchmarks/results/emr2c_s101/per_record.py $shape | tail -1)"
    done
  done
done | tee "$OUT/per_record_ab.log"
echo "[$(el) s] per-record"
cd benchmarks
PYTHONPATH=/tmp/site_new KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 \
  KVARN_BENCH_TABLE="$OUT/t32k_run1.md" timeout 200 python3 -m pytest -q -p no:cacheprovider bench_attend.py \
  -k "bandwidth or warm_interleaved or decode_cold" > "$OUT/t32k_run1.log" 2>&1
echo "grid rc $?"; grep -E "^warm|interleaved in blocks|int8 score mode" "$OUT/t32k_run1.md" | head -12
echo "[$(el) s] end"
