#!/usr/bin/env bash
# Device call s32 (eleventh session): the typed native quantiser (kvarn_quantize_tiles_typed: fp16 input, float32
# rounded to fp16 on the way in), chunked appends, the rollback high-water mark, pickling, and the integration's
# guards, on the Xeon + H200: the whole suite, the native drivers on every ISA (the avx512 table takes the avx2
# conversion), then the append-path measurements on 16 threads: quantise share through append, a 32K prefill.
set -uo pipefail
source benchmarks/results/device_build.sh
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/tests_all.log" | head -20; tail -2 "$OUT/tests_all.log"
echo "[$(el) s] tested"
cmake -S . -B build/nt -G Ninja -DKVARN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/native_build.log" 2>&1 &&
  cmake --build build/nt -j16 --target kvarn_native_test kvarn_simd_test >>"$OUT/native_build.log" 2>&1 || { echo "native build failed"; tail -20 "$OUT/native_build.log"; }
for isa in scalar avx2 avx512; do
  KVARN_ISA=$isa timeout 120 build/nt/native/cpu/kvarn_native_test >"$OUT/native_test_$isa.log" 2>&1; echo "native_test $isa exit $?"; tail -1 "$OUT/native_test_$isa.log"
done
timeout 120 build/nt/native/cpu/kvarn_simd_test >"$OUT/simd_test.log" 2>&1; echo "simd_test exit $?"; tail -1 "$OUT/simd_test.log"
echo "[$(el) s] native done"
(cd benchmarks && KVARN_BENCH_THREADS=16 timeout 200 python3 -m pytest -q -p no:cacheprovider bench_attend.py -k quantize_share \
  --benchmark-json="$OUT/qshare_xeon.json" 2>&1 | grep -E "quantise per|passed|failed" | tee "$OUT/qshare_xeon.log")
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/prefill_xeon.log"
import time, tracemalloc, numpy as np, kvarn
rng = np.random.default_rng(0)
H, n, D = 8, 32768, 128
for dt in (np.float16, np.float32):
    k = rng.standard_normal((H, n, D)).astype(dt)
    best = 1e9
    for rep in range(3):
        c = kvarn.KVCache(H, D); t = time.perf_counter(); c.append(k, k); best = min(best, time.perf_counter() - t)
    c = kvarn.KVCache(H, D); tracemalloc.start(); c.append(k, k); peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    print(f"Xeon 16 threads, 32K x 8 heads x 128, {dt.__name__}: append {best*1e3:.0f} ms, peak {peak/2**20:.1f} MiB, held {c.allocated_nbytes/2**20:.1f} MiB")
PY
echo "[$(el) s] end"
