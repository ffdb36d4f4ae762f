#!/usr/bin/env bash
# Runs kvarn on emulated x86-64 CPUs (qemu-user's TCG, which raises SIGILL for an instruction the
# chosen CPU model lacks), on an x86-64 Linux machine:
#   - Nehalem (SSE4.2, no AVX): dispatch must find only the scalar kernels, and no AVX instruction may run
#     outside the ISA files: not in the import, the Cython wrapper, the dispatcher or the scalar kernels;
#   - Haswell (AVX2 + FMA + F16C, no AVX-512): the avx2 kernels against scalar, avx512 refused.
#   scripts/emulated_x86.sh [BUILD_DIR]                 the native drivers on both CPU models;
#   scripts/emulated_x86.sh BUILD_DIR --python [ARGS]   also kvarn installed natively into a venv (test
#       extra) and pytest (default: the whole tests/ folder) run by that venv's python on the Nehalem
#       model; tests that need torch or the model wheels skip there (not installed: slow under TCG).
# Needs: apt-get install qemu-user
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(mkdir -p "${1:-build-emulated}" && cd "${1:-build-emulated}" && pwd)"
shift || true

cmake -S . -B "$build/core" -DKVARN_CUDA=OFF >/dev/null
cmake --build "$build/core" -j"$(nproc)" --target kvarn_native_test kvarn_simd_test
drivers="$build/core/native/cpu"
echo "== Nehalem: scalar only"
qemu-x86_64 -cpu Nehalem "$drivers/kvarn_native_test"
for isa in avx2 avx512 bogus; do KVARN_ISA=$isa qemu-x86_64 -cpu Nehalem "$drivers/kvarn_native_test"; done
qemu-x86_64 -cpu Nehalem "$drivers/kvarn_simd_test"
echo "== Haswell: avx2 (TCG has no AVX-512)"
qemu-x86_64 -cpu Haswell "$drivers/kvarn_native_test"
for isa in scalar avx2 avx512; do KVARN_ISA=$isa qemu-x86_64 -cpu Haswell "$drivers/kvarn_native_test"; done
qemu-x86_64 -cpu Haswell "$drivers/kvarn_simd_test"

[ "${1:-}" = "--python" ] || exit 0
shift
venv="$build/venv"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# Built and installed natively (the build is not under test here; what it made is).
KVARN_CUDA=OFF "$venv/bin/python" -m pip install -q ".[test]"
# The venv's python becomes a script running the real interpreter under qemu with itself as argv[0], so
# that sys.executable (which tests start in subprocesses) runs on the emulated CPU too.
real="$(readlink -f "$venv/bin/python")"
rm -f "$venv"/bin/python "$venv"/bin/python3 "$venv"/bin/python3.*[0-9]
printf '#!/bin/sh\nexec qemu-x86_64 -cpu Nehalem -0 "$0" %s "$@"\n' "$real" > "$venv/bin/python"
chmod +x "$venv/bin/python"
ln -s python "$venv/bin/python3"
"$venv/bin/python" -c 'import kvarn; print("Nehalem:", kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())'
[ $# -gt 0 ] || set -- -q -rs tests
"$venv/bin/python" -m pytest -p no:cacheprovider "$@"
