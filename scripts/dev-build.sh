#!/usr/bin/env bash
# Build the native libraries into build/dev/ for a source checkout used with JAX_AITER_LIB_DIR=build/dev/lib.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
cmake -S . -B build/dev -G Ninja -DPython_EXECUTABLE="$python" -DCMAKE_INSTALL_PREFIX="$PWD/build/dev/install" "$@"
cmake --build build/dev
cmake --install build/dev >/dev/null
echo "libraries in $PWD/build/dev/install/jax_aiter/lib"
