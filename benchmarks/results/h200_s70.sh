#!/usr/bin/env bash
# Thirtieth session, device call s70 (the lent Xeon, CPU only): this session's code (kvarn_scan_f32 and the shorter
# host path) built with that machine's toolchain: test_cache.py (the new tail-store and scan tests) and test_simd.py;
# then threads_after_torch.py: kvarn threads 1 / 2 / 4 / 8 / 16 for a call after torch work, data for a pool rule.
set -uo pipefail
. benchmarks/results/device_prologue.sh
D=benchmarks/results/xeon2c_s70_host_path
KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target build/site_new \
  -C build-dir=build/cpu . >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
PYTHONPATH=$PWD/build/site_new python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kvarn.get_num_threads())" | tee "$OUT/machine.txt"
PYTHONPATH=$PWD/build/site_new timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cache.py tests/test_simd.py 2>&1 | tail -3 | tee "$OUT/tests.log"
echo "[$(el) s] tested"
timeout 200 python3 $D/threads_after_torch.py $PWD/build/site_new 1 2 4 8 16 2>&1 | tee "$OUT/threads_after_torch.log"
echo "[$(el) s] end"
