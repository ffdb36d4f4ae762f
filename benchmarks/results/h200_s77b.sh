#!/usr/bin/env bash
# Thirty-seventh session, device call s77b (the lent Xeon, CPU only): call s77's int16 A/B again with more rounds
# (it read 0.97-1.10 in three), the avx2 kernels forced, VNNI on and off, six alternating pairs per point.
set -uo pipefail
. benchmarks/results/device_prologue.sh
R7=benchmarks/results/zen3_2c_s77
build() {  # $1 tree, $2 site
  (cd "$1" && KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target "$2" \
    -C build-dir=build/cpu -C cmake.define.KVARN_CUDA=OFF . >"$OUT/build_$(basename "$2").log" 2>&1) || { tail -30 "$OUT/build_$(basename "$2").log"; exit 1; }
}
if [ ! -d /tmp/site_new ] || [ ! -d /tmp/site_old ]; then
  rm -rf /tmp/oldtree /tmp/site_new /tmp/site_old && mkdir /tmp/oldtree && cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/oldtree/
  cp old_kernels_avx2.cpp /tmp/oldtree/native/cpu/avx2/kernels_avx2.cpp
  build . /tmp/site_new & build /tmp/oldtree /tmp/site_old & wait
fi
echo "[$(el) s] built"
for r in 1 2 3 4 5 6; do for vnni in 1 0; do for shape in 8,32,128 3,9,64; do
  for b in old new; do
    echo -n "r$r vnni$vnni $b: "; KVARN_ISA=avx2 VNNI=$vnni SHAPE=$shape N=300 PYTHONPATH=/tmp/site_$b taskset -c 2 python3 $R7/aprof.py
  done
done; done; done 2>&1 | tee "$OUT/ab_avx2_int16_1t.log"
echo "[$(el) s] end"
