#!/usr/bin/env bash
# Installs kvarn (core and test extra, no torch) from a clean clone of this checkout's HEAD into a fresh venv
# per CPython interpreter, then runs the test suite and `kvarn demo` with each, one after another:
#   scripts/python_versions.sh [PYTHON ...] [-- PYTEST_ARGS]
# Without interpreters: every CPython 3.9 or later that pyenv has (~/.pyenv/versions). Tests that need
# torch or the model wheels skip (not installed), as do GPU tests. Needs network access to PyPI (or a mirror).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/kvarn-pyvers.XXXXXX")"
pythons=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do pythons+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
if [ ${#pythons[@]} -eq 0 ]; then
  for d in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*; do
    minor="$(basename "$d" | cut -d. -f2)"
    [ -x "$d/bin/python" ] && [ "$minor" -ge 9 ] 2>/dev/null && pythons+=("$d/bin/python")
  done
fi
[ ${#pythons[@]} -gt 0 ] || { echo "no interpreter given or found under pyenv" >&2; exit 2; }
git clone -q "$repo" "$work/src"
status=0
n=0
for py in "${pythons[@]}"; do
  n=$((n + 1))
  echo "=== $py ($("$py" -V 2>&1)), $(date -u +%H:%M:%S) UTC"
  venv="$work/venv$n"
  "$py" -m venv "$venv" && . "$venv/bin/activate" || { status=1; continue; }
  python -m pip install -q --upgrade pip
  # KVARN_CUDA=OFF: the CUDA module is not what this checks, and it triples the build time where nvcc exists
  if ! (cd "$work/src" && KVARN_CUDA=OFF python -m pip install -q ".[test]"); then
    echo "FAILED: install"; status=1; deactivate; continue
  fi
  python -c "import sys, numpy, kvarn; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'kvarn', kvarn.__version__, 'ISAs', kvarn.available_isas())"
  (cd "$work/src" && python -m pytest -q -p no:cacheprovider "${@:-tests}" 2>&1 | tail -2) || status=1
  (cd "$work" && kvarn demo | tail -3) || status=1
  deactivate
done
rm -rf "$work"
exit $status
