#!/usr/bin/env bash
# Build AITER's MHA (libmha_fwd, libmha_bwd) and opus RMSNorm libraries from the pinned third_party/aiter with
# AITER's own JIT build, and stage them with the ASM code objects and kernel tables the bridge loads, for
# GPU_ARCHS (default "gfx942;gfx950"). A stage whose manifest matches (AITER commit, architectures, this
# build's configuration, file hashes) is reused; a mismatch rebuilds, or fails with --reuse-only.
# Without the submodule checked out it skips the bridge and says so. See docs/building-rocm.md (time, size).
#
#   GPU_ARCHS="gfx942;gfx950" scripts/build-aiter.sh [--reuse-only] [--jobs N]
#
# Needs a ROCm machine (hipcc, ninja) and the Python packages AITER's build imports (pandas, ...); no GPU.
# Then build jax-aiter with -DJA_ENABLE_HIP=ON: CMake installs the stage as jax_aiter/lib/aiter.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && python=.venv/bin/python
export GPU_ARCHS=${GPU_ARCHS:-gfx942;gfx950}

if [ ! -f third_party/aiter/aiter/jit/core.py ]; then
  echo "build-aiter: AITER bridge skipped: third_party/aiter is not checked out" \
       "(git submodule update --init --recursive third_party/aiter)"
  exit 0
fi

exec "$python" tools/aiter_build.py stage --aiter third_party/aiter --stage build/aiter \
  --jit-dir build/aiter-jit --archs "$GPU_ARCHS" "$@"
