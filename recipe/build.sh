#!/usr/bin/env bash
# The staging build of recipe.yaml: install jax-aiter into $PREFIX exactly as `pip install .` does for users,
# with the native libraries of this variant's GPU backend; the package outputs then split the installed files.
set -euo pipefail

# JA_ENABLE_CUDA and JA_ENABLE_HIP are read by pyproject.toml. The rocm packages require the AITER bridge, so
# JA_ENABLE_AITER=ON makes a missing submodule or stage fail the build instead of leaving the bridge out.
case "$JA_GPU_BACKEND" in
  cpu)  export JA_ENABLE_CUDA=OFF JA_ENABLE_HIP=OFF; aiter=OFF ;;
  cuda) export JA_ENABLE_CUDA=ON JA_ENABLE_HIP=OFF; aiter=OFF ;;
  rocm) export JA_ENABLE_CUDA=OFF JA_ENABLE_HIP=ON; aiter=ON
        # CMake finds the HIP compiler through ROCM_PATH and ROCm's package configurations (hip) under it.
        export CMAKE_PREFIX_PATH="$ROCM_PATH${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}" ;;
  *) echo "build.sh: unknown gpu_backend '$JA_GPU_BACKEND'" >&2; exit 1 ;;
esac

# JA_BUILD_PYTHON is set only by the offline CI variant, whose host prefix has no Python. --prefix makes that
# interpreter install into $PREFIX too (for the host Python it is where pip installs anyway).
python=${JA_BUILD_PYTHON:-$PYTHON}
"$python" -m pip install . --no-deps --no-build-isolation --disable-pip-version-check --prefix "$PREFIX" \
  --config-settings=cmake.define.JA_HIP_ARCHS="$JA_HIP_ARCHS" --config-settings=cmake.define.JA_ENABLE_AITER="$aiter"
