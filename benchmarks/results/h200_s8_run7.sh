#!/usr/bin/env bash
# s8 device call 7: to_cpu / load_cpu now go through KVCache.to_parts / from_parts (Python only);
# the GPU tests again (kernels unchanged, prebuilt).
set -uo pipefail
md5sum -c --quiet .s8/src.md5 && echo "sources match the prebuilt library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s8/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
timeout 120 python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -4 | tee "$OUT/test.log"
