#!/usr/bin/env bash
# Builds the native core and its test drivers with AddressSanitizer + UBSan and runs them
# once per ISA this machine supports. KVARN_SANITIZE=OFF builds the same drivers without the
# sanitizers (for a compiler that has no sanitizer runtime; tests/test_native.py falls back to it).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-asan}"
cmake -S . -B "$build" -DKVARN_SANITIZE="${KVARN_SANITIZE:-ON}" -DKVARN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target kvarn_native_test kvarn_simd_test kvarn_c_example
for isa in scalar avx2 avx512; do
  if grep -qw "$( [ $isa = avx512 ] && echo avx512bw || echo $isa )" /proc/cpuinfo || [ $isa = scalar ]; then
    KVARN_ISA=$isa "$build/native/cpu/kvarn_native_test"
    # The C ABI from C: a cache quantised and attended, checked against float64 attention (examples/c/decode.c).
    KVARN_ISA=$isa "$build/native/cpu/kvarn_c_example"
  fi
done
# A forced ISA that cannot run: every kernel call must refuse (KVARN_ERR_ISA) and write nothing.
KVARN_ISA=bogus "$build/native/cpu/kvarn_native_test"
# Every SIMD kernel against scalar at odd sizes, every score mode (exact-size heap buffers).
"$build/native/cpu/kvarn_simd_test"
