#!/usr/bin/env bash
# The staging build of recipe.yaml: install jax-aiter into $PREFIX as `pip install .` does for users, with the native
# libraries of this variant's GPU backend; the package outputs then split the installed files.
set -euo pipefail

# JA_ENABLE_CUDA and JA_ENABLE_HIP are read by pyproject.toml. The rocm packages require the AITER bridge, so
# JA_ENABLE_AITER=ON makes a missing AITER stage fail the build instead of leaving the bridge out.
case "$JA_GPU_BACKEND" in
  cpu)  export JA_ENABLE_CUDA=OFF JA_ENABLE_HIP=OFF; aiter=OFF ;;
  cuda) export JA_ENABLE_CUDA=ON JA_ENABLE_HIP=OFF; aiter=OFF ;;
  rocm) export JA_ENABLE_CUDA=OFF JA_ENABLE_HIP=ON; aiter=ON
        # CMake finds the HIP compiler through ROCM_PATH and ROCm's package configurations (hip) under it.
        export CMAKE_PREFIX_PATH="$ROCM_PATH${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
        # AITER's libraries, built by AITER's own JIT build from the source the recipe fetched (the pinned commit)
        # and staged with AITER's code objects and kernel tables in build/aiter, where CMake
        # checks and installs them (docs/building-rocm.md).
        python tools/aiter_build.py stage --aiter third_party/aiter --stage build/aiter --jit-dir build/aiter-jit \
          --archs "$JA_HIP_ARCHS" ${CPU_COUNT:+--jobs "$CPU_COUNT"} ;;
  *) echo "build.sh: unknown gpu_backend '$JA_GPU_BACKEND'" >&2; exit 1 ;;
esac

# The python on PATH is the host environment's. --prefix makes it install into $PREFIX whichever Python it is.
# JA_INSTALL_RPATH: the libraries find the environment's lib/ (libstdc++) from site-packages/jax_aiter/lib; the
# recipe turns off rattler-build's RPATH rewriting so the files stay as their build records describe them.
python -m pip install . --no-deps --no-build-isolation --disable-pip-version-check --prefix "$PREFIX" \
  --config-settings=cmake.define.JA_HIP_ARCHS="$JA_HIP_ARCHS" \
  --config-settings=cmake.define.JA_ENABLE_AITER="$aiter" \
  --config-settings=cmake.define.JA_INSTALL_RPATH='$ORIGIN/../../../..'
python "$RECIPE_DIR/dist_info.py" "$PREFIX"
