#!/usr/bin/env bash
# The test suite for the installed package (no GPU needed; GPU tiers skip themselves without one).
# Runs from tests/ so `import jax_aiter` resolves to the installed package and its built libraries.
set -euo pipefail
cd "$(dirname "$0")/../tests"
python=${PYTHON:-python}
exec "$python" -m pytest -p no:cacheprovider --rootdir=.. -c ../pyproject.toml "$@" .
