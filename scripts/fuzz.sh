#!/usr/bin/env bash
# Coverage-guided fuzzing of the C ABI (tests/native/fuzz_capi.cpp, a libFuzzer target) under
# AddressSanitizer + UBSan, once per ISA this machine supports:
#   bash scripts/fuzz.sh [build-dir] [seconds per ISA] [isa ...]
# The native sources are built as scripts/asan.sh builds them: through CMake (native/cpu's kvarn_core,
# KVARN_SANITIZE=ON: -fsanitize=address,undefined,float-cast-overflow, no recovery), so every file keeps
# the flags native/cpu/CMakeLists.txt gives it (baseline files -mno-avx; avx2/ -mavx2 -mfma -mf16c
# -mno-avx512f; avx512/ -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c;
# -ffp-contract=off), never -march=native. Only the compiler differs: clang, with libFuzzer's
# coverage instrumentation (-fsanitize=fuzzer-no-link) added to every file.
# Needs clang and libFuzzer (Debian: apt-get install clang libclang-rt-dev).
# Environment:
#   FUZZ_CORPUS   corpus directory (shared by the ISAs; default <build-dir>/fuzz-corpus)
#   FUZZ_CRASHES  where crash / timeout / leak inputs go (default <build-dir>/fuzz-crashes)
#   FUZZ_ARGS     extra libFuzzer arguments; KVARN_FUZZ_SKIP / KVARN_FUZZ_VERBOSE / KVARN_FUZZ_STATS: see fuzz_capi.cpp
# Reproduce a saved input: KVARN_FUZZ_ISA=<isa> KVARN_FUZZ_VERBOSE=1 <build-dir>/fuzz_capi <file>
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-fuzz}"
seconds="${2:-300}"
shift $(( $# > 2 ? 2 : $# ))
isas=("$@")
[ ${#isas[@]} -gt 0 ] || isas=(scalar avx2 avx512)

pick() {  # the first of the given commands on PATH
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 && { echo "$c"; return; }; done
  return 1
}
CXX="${CXX:-$(pick clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14 || true)}"
CC="${CC:-$(pick clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14 || true)}"
case "$CXX" in *clang*) ;; *) echo "fuzz.sh: needs clang++ with libFuzzer (apt-get install clang libclang-rt-dev)" >&2; exit 2 ;; esac

# The library, as asan.sh builds it (CMake, KVARN_SANITIZE=ON), with clang and coverage instrumentation.
cmake -S . -B "$build" -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" -DKVARN_SANITIZE=ON -DKVARN_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
cmake --build "$build" -j"$(nproc)" --target kvarn_core
# The harness: baseline ISA like every non-SIMD file (it calls only the C ABI).
"$CXX" -std=c++17 -O1 -g -fno-omit-frame-pointer -mno-avx -Wall -Wextra \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude tests/native/fuzz_capi.cpp "$build/native/cpu/libkvarn.a" -lpthread -o "$build/fuzz_capi"

corpus="${FUZZ_CORPUS:-$build/fuzz-corpus}"
crashes="${FUZZ_CRASHES:-$build/fuzz-crashes}"
mkdir -p "$corpus" "$crashes"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# One libFuzzer process (one worker, no -jobs) per ISA; after a finding (the input is saved under $crashes,
# and the process stops) it starts again for the time left, from the corpus so far.
args=(-max_len=4096 -len_control=0 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1)
for isa in "${isas[@]}"; do
  flag=$isa; [ "$isa" = avx512 ] && flag=avx512bw
  if [ "$isa" != scalar ] && ! grep -qw "$flag" /proc/cpuinfo; then
    echo "== $isa: not supported by this CPU, skipped"
    continue
  fi
  log="$build/fuzz-$isa.log"
  : >"$log"
  echo "== $isa: ${seconds}s, log $log"
  end=$((SECONDS + seconds))
  while (( SECONDS < end )); do
    set +e
    # shellcheck disable=SC2086
    KVARN_FUZZ_ISA=$isa "$build/fuzz_capi" "${args[@]}" -max_total_time=$((end - SECONDS)) \
      -artifact_prefix="$crashes/$isa-" ${FUZZ_ARGS:-} "$corpus" >>"$log" 2>&1
    rc=$?
    set -e
    [ $rc -eq 0 ] && break
    echo "   libFuzzer exited $rc at ${SECONDS}s: $(grep -E '^(INVARIANT|SUMMARY)' "$log" | tail -1)"
    grep -E 'Test unit written to' "$log" | tail -1 | sed 's/^/   /'
  done
  runs=$(awk '/^stat::number_of_executed_units/ {n += $2} END {print n + 0}' "$log")
  echo "   executed $runs inputs in ${seconds}s ($((runs / (seconds > 0 ? seconds : 1))) exec/s)"
  # Coverage of the corpus as it now stands, under this ISA.
  KVARN_FUZZ_ISA=$isa "$build/fuzz_capi" -runs=0 "${args[@]}" "$corpus" 2>&1 | grep -E 'INITED' | sed 's/^/   corpus: /'
done
echo "== inputs of findings in $crashes:"
ls -l "$crashes"
