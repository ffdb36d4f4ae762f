#!/usr/bin/env bash
# Builds the native core and its test drivers with ThreadSanitizer and runs them once per ISA this machine supports
# (by hand: TSan cannot share a build with ASan, and a second build would double test_native's time). The drivers
# call the C ABI from several threads at once: the shared pool under concurrent callers (attend and quantise from
# four threads, each result checked against the same call made alone), the ISA setter and its error text, fork.
#   bash scripts/tsan.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-tsan}"
cmake -S . -B "$build" -DKVARN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS=-fsanitize=thread \
  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread >/dev/null
cmake --build "$build" -j"$(nproc)" --target kvarn_native_test kvarn_simd_test kvarn_c_example
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}"
for isa in scalar avx2 avx512; do
  if grep -qw "$( [ $isa = avx512 ] && echo avx512bw || echo $isa )" /proc/cpuinfo || [ $isa = scalar ]; then
    KVARN_ISA=$isa "$build/native/cpu/kvarn_native_test"
    KVARN_ISA=$isa "$build/native/cpu/kvarn_c_example"
  fi
done
"$build/native/cpu/kvarn_simd_test"
