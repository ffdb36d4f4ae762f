#!/usr/bin/env bash
# Thirty-eighth session, device calls s78b to s78g (the lent Xeon, CPU only): the Zen 3's sampled profile of the decode kernel
# (results/zen3_2c_s78/) on the Xeon's avx512 kernels and, forced, its avx2 ones. This machine has no perf (call
# s78 found none), so sampler.so (LD_PRELOAD, the main thread's instruction pointer every 100 us) takes the samples
# and breakdown_samples.py groups them (addr2line -i on each sampled instruction of a -g, unstripped build of this
# tree; -g changes no instruction). One thread, 32K, both shapes.
set -uo pipefail
. benchmarks/results/device_prologue.sh
R=benchmarks/results/zen3_2c_s78
for tool in gcc nm readelf addr2line; do command -v $tool >/dev/null || { echo "no $tool"; exit 1; }; done
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400 | tee "$OUT/machine.txt"
gcc -O2 -Wall -shared -fPIC -o /tmp/sampler.so $R/sampler.c -lrt || exit 1
(KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_g \
  -C build-dir=build/cpug -C cmake.define.KVARN_CUDA=OFF -C install.strip=false -C cmake.define.CMAKE_CXX_FLAGS=-g . \
  >"$OUT/build_g.log" 2>&1) || { tail -30 "$OUT/build_g.log"; exit 1; }
echo "[$(el) s] built"
SO=$(ls /tmp/site_g/kvarn/_native*.so)
rm -rf /tmp/sdir && mkdir /tmp/sdir
for isa in avx512 avx2; do for shape in 3,9,64 8,32,128; do
  echo "== $isa SHAPE=$shape" | tee -a "$OUT/breakdown.log"
  # LD_PRELOAD for python3 alone: timeout would take the samples too and write its own at its exit (call s78c)
  rm -f /tmp/samples.txt.maps; SAMPLER_OUT=/tmp/samples.txt KVARN_ISA=$isa SHAPE=$shape SECS=8 PYTHONPATH=/tmp/site_g \
    timeout 120 env LD_PRELOAD=/tmp/sampler.so python3 $R/loop.py 2>&1 | tee -a "$OUT/breakdown.log"
  # the samples, the mappings and (below) the module come back: breakdown_samples.py runs on them at home (s78e)
  cp /tmp/samples.txt "/tmp/sdir/samples_${isa}_${shape//,/x}.txt"; cp /tmp/samples.txt.maps "/tmp/sdir/samples_${isa}_${shape//,/x}.txt.maps"
  echo "[$(el) s]"
done; done
cp "$SO" /tmp/sdir/ && tar czf "$OUT/samples.tgz" -C /tmp/sdir .  # one file: a call brings back few
echo "[$(el) s] end"
