#!/usr/bin/env bash
# Builds the native core and its test drivers under a sanitizer and runs them once per ISA this machine supports.
#   bash scripts/asan.sh [build-dir]                     AddressSanitizer + UBSan (+ float-cast-overflow), no recovery
#   KVARN_SANITIZE=OFF bash scripts/asan.sh [build-dir]  the same drivers without sanitizers (for a compiler that has no
#                                                        sanitizer runtime; tests/test_native.py falls back to it)
#   SANITIZER=thread bash scripts/asan.sh [build-dir]    ThreadSanitizer (by hand, scripts/tsan.sh: it cannot share
#                                                        a build with ASan, and a second build would double
#                                                        test_native's time)
# The drivers call the C ABI from several threads at once (the shared pool under concurrent callers: attend and
# quantise from four threads, each result checked against the same call made alone; the ISA setter; fork), so
# both runtimes see the pool's threads.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${SANITIZER:-address}" in
  address)
    build="${1:-build-asan}"
    flags=(-DKVARN_SANITIZE="${KVARN_SANITIZE:-ON}") ;;
  thread)
    build="${1:-build-tsan}"
    flags=(-DKVARN_SANITIZE=OFF -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_CXX_FLAGS=-fsanitize=thread
           -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread)
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}" ;;
  *) echo "SANITIZER must be address or thread, not '$SANITIZER'" >&2; exit 2 ;;
esac
cmake -S . -B "$build" "${flags[@]}" -DKVARN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
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
