#!/usr/bin/env bash
# The Python test suite over an AddressSanitizer + UBSan build of kvarn's extension module, so that every path
# the tests take from Python into native code (the Cython wrapper's buffers and strides, the caches' views, the
# thread pool under concurrent Python threads) runs instrumented. scripts/asan.sh covers the C ABI from C.
#   bash scripts/asan_python.sh [site-dir] [-- PYTEST_ARGS]      (PYTEST_ARGS default: tests)
# Builds kvarn (KVARN_SANITIZE=ON: -fsanitize=address,undefined,float-cast-overflow, no recovery, CUDA off) into
# site-dir (default build-asan-python/site) with the current interpreter's pip (needs scikit-build-core, cython,
# cmake and ninja there: --no-build-isolation), then runs pytest from the checkout's root with the sanitizer runtimes
# preloaded and site-dir first on the path (the package's sources sit under src/, so `import kvarn` finds the
# instrumented build; the interpreter itself is not instrumented). Leak checking is off: CPython keeps its own
# allocations to exit.
# Tests that need the installed wheel's layout, the native drivers or mypy are left out (test_packaging,
# test_native, test_typing: the drivers run under the sanitizers in scripts/asan.sh already), and so is the one test
# that bounds CPU time (the pool's helpers after an isolated call: instrumented calls run long enough to exceed it).
set -euo pipefail
cd "$(dirname "$0")/.."
site="build-asan-python/site"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then site="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-python}
rm -rf "$site"
KVARN_CUDA=OFF "$python" -m pip install -q --no-build-isolation --no-deps --target "$site" . \
  -C cmake.define.KVARN_SANITIZE=ON -C install.strip=false -C build-dir="$(dirname "$site")/build"
ldd "$site"/kvarn/_native*.so | grep -q libasan ||
  { echo "asan_python.sh: the module is not instrumented" >&2; exit 1; }
cc=${CC:-gcc}
preload="$("$cc" -print-file-name=libasan.so):$("$cc" -print-file-name=libubsan.so)"
site="$(cd "$site" && pwd)"
# -s: a sanitizer's report goes to the process's stderr, which pytest's capture would swallow with the process (ASan
# aborts; UBSan, with -fno-sanitize-recover, exits with status 1 and ignores log_path in this combined build).
LD_PRELOAD="$preload" ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" PYTHONPATH="$site" \
  "$python" -m pytest -q -s -p no:cacheprovider --ignore=tests/test_packaging.py --ignore=tests/test_native.py \
  --ignore=tests/test_typing.py \
  --deselect tests/test_simd.py::test_pool_helpers_sleep_after_an_isolated_call "${@:-tests}"
