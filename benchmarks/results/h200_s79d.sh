#!/usr/bin/env bash
# Thirty-ninth session, device call s79d (the lent Xeon, CPU only): the native driver's new case (two NaN weights in one
# sum, tests/native/native_test.cpp) under scripts/asan.sh, on a copy of the tree with the avx512 reduction fix reverted
# (UBSan must stop it) and on the tree as committed (clean).
set -uo pipefail
. benchmarks/results/device_prologue.sh
rm -rf /tmp/reverted && mkdir /tmp/reverted && cp -r include native tests scripts examples CMakeLists.txt /tmp/reverted/
python3 - <<'PY'
p = "/tmp/reverted/native/cpu/avx512/kernels_avx512.cpp"
s = open(p).read()
assert s.count("reduce_add_epi32_wrapping(isum[h])") == 1
open(p, "w").write(s.replace("reduce_add_epi32_wrapping(isum[h])", "_mm512_reduce_add_epi32(isum[h])"))
PY
(cd /tmp/reverted && CMAKE_BUILD_PARALLEL_LEVEL=16 bash scripts/asan.sh /tmp/b_rev) >"$OUT/asan_reverted.log" 2>&1
echo "reverted: rc=$? [$(el) s]"; grep -m3 -E "runtime error|FAIL" "$OUT/asan_reverted.log"
CMAKE_BUILD_PARALLEL_LEVEL=16 bash scripts/asan.sh /tmp/b_fix >"$OUT/asan_fixed.log" 2>&1
echo "fixed: rc=$? [$(el) s]"; tail -3 "$OUT/asan_fixed.log"
