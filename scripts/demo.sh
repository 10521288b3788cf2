#!/usr/bin/env bash
# Train the tiny Llama-style demo model built from jax_aiter ops.
set -euo pipefail
exec "${PYTHON:-python}" -m jax_aiter.cli demo "$@"
