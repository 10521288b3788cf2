#!/usr/bin/env bash
# Build the conda packages (docs/packaging.md). With no arguments: the CI-only cpu packages, offline, into
# build/conda; `--backend cuda --channel conda-forge` and the like build a real variant.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" scripts/conda_build.py "$@"
