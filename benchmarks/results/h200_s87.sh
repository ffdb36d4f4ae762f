#!/usr/bin/env bash
# Forty-seventh session, device call s87: bitid_compilers.py (results/zen4_2c_s87/) on the lent machine, whose Xeon
# has AVX-VNNI, so that its avx2 integer loops run the {vex} vpdpwssd / vpdpbusd forms the Zen 4 lacks: the hashes of
# records and outputs against the Zen 4's GCC 12 build (bitid_gcc12.txt), per compiler found there.
source benchmarks/results/device_prologue.sh
here=benchmarks/results/zen4_2c_s87
{ lscpu | grep -E "Model name|^CPU\(s\)|Flags"; gcc --version | head -1; ld --version | head -1
  for c in clang++ clang++-14 clang++-15 clang++-16 clang++-17 clang++-18; do command -v $c; done; } > "$OUT/machine.txt" 2>&1
grep -o -w "avx_vnni\|avx512_vnni" "$OUT/machine.txt" | sort -u
specs="gcc:gcc:g++"
for c in clang-18 clang-17 clang-16 clang-15 clang-14 clang; do
  if command -v "$c" >/dev/null && command -v "${c/clang/clang++}" >/dev/null; then specs="$specs $c:$c:${c/clang/clang++}"; break; fi
done
for spec in $specs; do
  IFS=: read -r tag cc cxx <<< "$spec"
  site=/tmp/site_$tag
  rm -rf "$site"
  if ! CC=$cc CXX=$cxx KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q \
      --target "$site" -C build-dir=build/cpu_$tag -C cmake.define.KVARN_CUDA=OFF . > "$OUT/build_$tag.log" 2>&1; then
    echo "$tag: build failed"; tail -20 "$OUT/build_$tag.log"; continue
  fi
  echo "[$(el) s] built with $($cxx --version | head -1)"
  (cd /tmp && PYTHONPATH=$site python3 "$OLDPWD/$here/bitid_compilers.py") > "$OUT/bitid_xeon_$tag.txt" 2>&1
  rc=$?
  echo "$tag: rc=$rc, $(wc -l < "$OUT/bitid_xeon_$tag.txt") lines, $(diff "$here/bitid_gcc12.txt" "$OUT/bitid_xeon_$tag.txt" | grep -c '^>') differ from the Zen 4's gcc12"
  PYTHONPATH=$site python3 -c "import kvarn; print(kvarn.active_isa(), kvarn.available_isas())"
done
# The avx2 kernels' cross-ISA tests with their AVX-VNNI forms, over the gcc build.
PYTHONPATH=/tmp/site_gcc KVARN_REQUIRE_ISAS=avx2,avx512 timeout 400 python3 -m pytest -q -x -n 12 tests/test_simd.py -p no:cacheprovider 2>&1 | tail -3
echo "[$(el) s] done"
