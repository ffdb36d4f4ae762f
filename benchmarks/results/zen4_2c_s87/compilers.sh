#!/usr/bin/env bash
# Forty-seventh session: the package built by each compiler, the suite over each build, and the records and
# attention outputs compared across the builds (bitid_compilers.py prints a hash per ISA x preset x head_dim x
# score mode x threads). Debian 12: apt-get install clang-14 clang-16 g++-11 (g++-12 is the default).
# Usage: compilers.sh PYTHON   (a venv with the test extra and pytest-xdist; run from the repository root)
set -u
PY=${1:?python}
here=benchmarks/results/zen4_2c_s87
for spec in gcc12:gcc-12:g++-12 gcc11:gcc-11:g++-11 clang14:clang-14:clang++-14 clang16:clang-16:clang++-16; do
    IFS=: read -r tag cc cxx <<< "$spec"
    site=/tmp/kvarn_site_$tag
    rm -rf "$site"
    CC=$cc CXX=$cxx KVARN_CUDA=OFF "$PY" -m pip install -q --no-build-isolation --no-deps --target "$site" . || { echo "$tag: build failed"; continue; }
    (cd /tmp && PYTHONPATH=$site "$PY" "$OLDPWD/$here/bitid_compilers.py") > "$here/bitid_$tag.txt"
    # CC / CXX also pick the compiler of tests/test_native.py's driver build (asan.sh, ASan + UBSan)
    CC=$cc CXX=$cxx PYTHONPATH=$site "$PY" -m pytest -q -n 2 tests/ -p no:cacheprovider 2>&1 | tail -1 > "$here/suite_$tag.log"
done
for tag in gcc11 clang14 clang16; do
    cmp -s "$here/bitid_gcc12.txt" "$here/bitid_$tag.txt" && echo "$tag: identical to gcc12" || echo "$tag: DIFFERS from gcc12"
done
