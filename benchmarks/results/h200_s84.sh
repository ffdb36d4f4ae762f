#!/usr/bin/env bash
# Forty-fourth session, lent Xeon + GPU (device call s84; an H100 came): the forty-third session's unrun plan (the
# avx512 L2 prefetch's cold/warm A/B against the kernels before it, 1 / 2 / 16 threads, both shapes at 32K; the int8
# AVX-VNNI error check), then the whole test suite over the CUDA build, every ISA required (the first full GPU +
# avx512 run since the int8 centring and the prefetch).
set -uo pipefail
. benchmarks/results/device_prologue.sh
D=benchmarks/results/zen4_2c_s83
lscpu | grep -E "Model name|^CPU\(s\)|L3" > "$OUT/machine.txt"; grep -o -w -E "avx512_vnni|avx_vnni|amx_int8" /proc/cpuinfo | sort -u >> "$OUT/machine.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/machine.txt"
rm -rf /tmp/oldtree && mkdir /tmp/oldtree && cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/oldtree/ &&
  (cd /tmp/oldtree && patch -s -p1 < "$OLDPWD/benchmarks/results/h200_s84_unprefetch.patch") || exit 1
build_site . /tmp/site_new & new=$!
build_site /tmp/oldtree /tmp/site_old & old=$!
build_cuda; cuda=$?
wait $new && wait $old && [ $cuda -eq 0 ] || exit 1
echo "[$(el) s] all built"
for r in 1 2 3; do for th in 1 2 16; do for shape in 3,9,64 8,32,128; do
  rr=10; [ $shape = 8,32,128 ] && rr=4
  for b in old new; do
    echo -n "r$r avx512 th$th $shape $b: "
    COLD_MB=1200 TH=$th SHAPE=$shape R=$rr PYTHONPATH=/tmp/site_$b timeout 60 python3 $D/cold.py
  done
done; done; done > "$OUT/ab_cold_xeon.log" 2>&1
python3 $D/ab_summ.py "$OUT/ab_cold_xeon.log" | tee "$OUT/ab_cold_xeon_summary.log"
echo "[$(el) s] A/B done"
for isa in avx512 avx2; do  # avx2 forced: its int8 runs the AVX-VNNI (VEX vpdpbusd) form here
  KVARN_ISA=$isa timeout 100 python3 benchmarks/results/zen4_2c_s82/centred_scores_error.py /tmp/site_new "new $isa"
done > "$OUT/centred_scores_error.log" 2>&1
echo "[$(el) s] error check done"
left=$(( 560 - $(el) ))
KVARN_REQUIRE_ISAS=avx2,avx512 timeout $left python3 -m pytest -q -p no:cacheprovider -x tests 2>&1 | tail -40 > "$OUT/suite.log"
tail -5 "$OUT/suite.log"
echo "[$(el) s] end"
