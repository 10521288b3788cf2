#!/usr/bin/env bash
# Kernel benchmarks (copy ceiling, plain XLA, jax-aiter) on this machine's default device; JSON in benchmarks/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" benchmarks/bench_kernels.py "$@"
