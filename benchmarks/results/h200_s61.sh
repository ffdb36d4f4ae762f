#!/usr/bin/env bash
# Device calls s61 and s61b (twenty-first session; s61b after the review fixes to the integer modes): the int8 score mode on avx2 (vpmaddubsw + vpaddw, or AVX-VNNI's
# vpdpbusd) on the Xeon, which has AVX-512 VNNI and AVX-VNNI: CPU-only build, the whole suite (test_simd's
# int8 checks on avx2 and avx512, the VNNI and madd forms bit for bit), scripts/asan.sh on every ISA, one core's
# time per record per ISA / form / mode, and the headline 32K point's interleaved group (16 threads).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/cpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
python3 -c "import kvarn; from kvarn import _native as n; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), 'avx512_vnni', n.cpu_has_vnni(), 'avx_vnni', n.cpu_has_avx_vnni())" | tee "$OUT/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/machine.txt"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_simd.py 2>&1 | tail -12 | tee "$OUT/test_simd.log"
echo "[$(el) s] test_simd"
taskset -c 2 python3 benchmarks/results/s61_int8_record.py 7 2>&1 | tee "$OUT/int8_record.log"
echo "[$(el) s] per record"
(cd benchmarks && KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_SHAPES=hq32-hk8-d128 KVARN_BENCH_CONTEXTS=32768 \
  KVARN_BENCH_BATCHES=1 KVARN_BENCH_TABLE="$OUT/bench_32k_table.md" timeout 200 python3 -m pytest -q -p no:cacheprovider \
  bench_attend.py -k "test_attend or warm" 2>&1 | tail -40 > "$OUT/bench_32k.log"); tail -5 "$OUT/bench_32k.log"
grep -E "warm|int8 score" "$OUT/bench_32k_table.md"
echo "[$(el) s] bench"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 bash scripts/asan.sh build-asan-s61 >"$OUT/asan.log" 2>&1; echo "asan.sh rc $?" | tee -a "$OUT/asan.log"
grep -E "^ok|FAILED|ERROR|runtime error|all SIMD|native test" "$OUT/asan.log" | tail -12
echo "[$(el) s] asan"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 280 python3 -m pytest -q -p no:cacheprovider -rs tests --ignore=tests/test_cuda.py 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s] end"
