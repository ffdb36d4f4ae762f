#!/usr/bin/env bash
# Cross-builds kvarn for aarch64 and runs it under qemu-user, on an x86-64 Debian/Ubuntu machine:
#   scripts/cross_aarch64.sh [BUILD_DIR]           the native core and its test drivers: a non-x86
#       build leaves the AVX files out, the scalar kernels pass the native tests, and a forced x86
#       ISA (or an unknown one) is refused on every kernel call (KVARN_SANITIZE=ON: under ASan + UBSan);
#   scripts/cross_aarch64.sh BUILD_DIR --python [PYTEST ARGS...]   also the Python package: Debian's
#       arm64 Python 3.11 unpacked into a sysroot, a venv of it whose python runs under qemu, numpy,
#       Cython, scikit-build-core, pytest and hypothesis as PyPI's aarch64 wheels, kvarn installed
#       by `pip install --no-build-isolation .` with the cross toolchain, then pytest (default: the
#       whole tests/ folder, ~12 min). Tests needing torch, transformers or a GPU skip there.
# Needs: apt-get install g++-aarch64-linux-gnu qemu-user; for --python also
#   dpkg --add-architecture arm64 && apt-get update (apt-get download of the arm64 packages).
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(mkdir -p "${1:-build-aarch64}" && cd "${1:-build-aarch64}" && pwd)"
shift || true
toolchain="$build/aarch64.cmake"
cat > "$toolchain" <<TOOLCHAIN
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
TOOLCHAIN

core="$build/core"
# KVARN_SANITIZE=ON: the drivers under ASan + UBSan (LeakSanitizer cannot run under qemu: leaks unchecked).
cmake -S . -B "$core" -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DKVARN_CUDA=OFF -DKVARN_SANITIZE="${KVARN_SANITIZE:-OFF}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
cmake --build "$core" -j"$(nproc)" --target kvarn_native_test kvarn_simd_test
run() { qemu-aarch64 -L /usr/aarch64-linux-gnu "$@"; }
file "$core/native/cpu/kvarn_native_test"
run "$core/native/cpu/kvarn_native_test"
for isa in avx2 avx512 bogus; do  # not on this architecture: every call must refuse
  KVARN_ISA=$isa run "$core/native/cpu/kvarn_native_test"
done
run "$core/native/cpu/kvarn_simd_test"  # says the SIMD tables are absent

[ "${1:-}" = "--python" ] || exit 0
shift
sysroot="$build/sysroot"
if [ ! -x "$sysroot/usr/bin/python3.11" ]; then
  mkdir -p "$build/debs" "$sysroot"
  # Python 3.11 (and its headers) with the shared libraries of its standard library, and the C/C++ runtime.
  (cd "$build/debs" && apt-get download \
    python3.11-minimal:arm64 libpython3.11-minimal:arm64 libpython3.11-stdlib:arm64 libpython3.11:arm64 \
    libpython3.11-dev:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 \
    liblzma5:arm64 libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 libuuid1:arm64 \
    libcrypt1:arm64 libdb5.3:arm64 libgdbm6:arm64 libnsl2:arm64 libtirpc3:arm64 libc6:arm64 libstdc++6:arm64 \
    libgcc-s1:arm64)
  for deb in "$build"/debs/*.deb; do dpkg -x "$deb" "$sysroot"; done
fi
venv="$build/venv"
if [ ! -x "$venv/bin/pytest" ]; then
  rm -rf "$venv"
  qemu-aarch64 -L "$sysroot" "$sysroot/usr/bin/python3.11" -m venv --without-pip "$venv"
  # The venv's python: a script running the aarch64 interpreter under qemu with itself as argv[0], so
  # that sys.executable (which tests start in subprocesses) comes back through qemu too.
  rm -f "$venv"/bin/python*
  printf '#!/bin/sh\nexec qemu-aarch64 -L %s -0 "$0" %s "$@"\n' "$sysroot" "$sysroot/usr/bin/python3.11" > "$venv/bin/python"
  chmod +x "$venv/bin/python"
  ln -s python "$venv/bin/python3"
  ln -s python "$venv/bin/python3.11"
  python3 -m pip download -q -d "$build/wheels" --only-binary=:all: --platform manylinux2014_aarch64 \
    --python-version 3.11 --implementation cp pip numpy "scikit-build-core>=0.11" "cython>=3.0" pytest hypothesis
  "$venv/bin/python" "$(ls "$build"/wheels/pip-*.whl)/pip" install -q --no-index --find-links "$build/wheels" \
    pip numpy scikit-build-core cython pytest hypothesis
fi
# -idirafter: Debian's pyconfig.h includes <aarch64-linux-gnu/python3.11/pyconfig.h> from the sysroot.
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps . \
  -C cmake.define.CMAKE_TOOLCHAIN_FILE="$toolchain" -C cmake.define.CMAKE_CXX_FLAGS="-idirafter $sysroot/usr/include" \
  -C build-dir="$build/wheel"
"$venv/bin/python" -c 'import platform, kvarn; print(platform.machine(), kvarn.available_isas(), kvarn.active_isa())'
[ $# -gt 0 ] || set -- -q -rs tests
"$venv/bin/python" -m pytest -p no:cacheprovider "$@"
