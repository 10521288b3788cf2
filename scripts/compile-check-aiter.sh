#!/usr/bin/env bash
# Compile-check the AITER bridge (csrc/aiter) as HIP for every architecture in GPU_ARCHS (default
# "gfx942;gfx950") with Debian's clang-22 and the HIP headers of libamdhip64-dev; no GPU needed. The ASM
# launcher and the GEMM and RMSNorm handlers need no AITER headers. The MHA handlers include AITER's
# mha_fwd.h / mha_bwd.h. With an AITER checkout (first argument, else $AITER_DIR, else third_party/aiter when
# checked out) they compile against its headers, and tools/aiter_api_layout.py compares the stand-ins with
# them; without one, against the stand-in declarations in tests/fixtures/aiter/api_standin, whose layout
# tools/aiter_api_layout.py then checks against the one recorded from the pinned commit's real headers.
# Installs the toolchain with apt-get when it is missing (needs root or sudo).
#
# Objects are compiled with -fgpu-rdc: the sources are host code only (the device code is AITER's prebuilt
# code objects), and relocatable device code skips the device link, which would want ROCm's device libraries.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG=${CLANG:-/usr/lib/llvm-22/bin/clang++}
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "$PYTHON" = python3 ] && PYTHON=.venv/bin/python
GPU_ARCHS=${GPU_ARCHS:-gfx942;gfx950}

if [ ! -x "$CLANG" ] || [ ! -f /usr/include/hip/hip_runtime.h ]; then
  echo "compile-check-aiter: installing clang-22, lld-22, llvm-22 and libamdhip64-dev"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq clang-22 lld-22 llvm-22 libamdhip64-dev >/dev/null
fi

ffi_include=$("$PYTHON" -c "import jax.ffi; print(jax.ffi.include_dir())")
out=$(mktemp -d "${TMPDIR:-/tmp}/compile-check-aiter.XXXXXX")
trap 'rm -rf "$out"' EXIT

sources=(
  csrc/aiter/kernel_table.cc
  csrc/aiter/gemm_select.cc
  csrc/aiter/asm_launcher.cc
  csrc/aiter/gemm_fp4.cc
  csrc/aiter/gemm.cc
  csrc/aiter/rmsnorm.cc
  csrc/aiter/targets.cc
  csrc/aiter/mha.cc
  csrc/aiter/mha_targets.cc
)
aiter_dir=${1:-${AITER_DIR:-}}
if [ -z "$aiter_dir" ] && [ -f third_party/aiter/csrc/include/mha_fwd.h ]; then
  aiter_dir=third_party/aiter
fi
if [ -n "$aiter_dir" ]; then
  if [ ! -f "$aiter_dir/csrc/include/mha_fwd.h" ]; then
    echo "compile-check-aiter: $aiter_dir is not an AITER checkout (no csrc/include/mha_fwd.h)" >&2
    exit 1
  fi
  # tools/aiter_hip_compat.h: what AITER's headers need beyond Debian's HIP 5.2 headers (see the file).
  mha_includes="-isystem $aiter_dir/csrc/include -include tools/aiter_hip_compat.h"
  echo "compile-check-aiter: MHA handlers against the headers of $aiter_dir"
  "$PYTHON" tools/aiter_api_layout.py check --aiter "$aiter_dir" --clang "$CLANG"
else
  mha_includes="-Itests/fixtures/aiter/api_standin"
  echo "compile-check-aiter: no AITER checkout; MHA handlers against the stand-in declarations"
  "$PYTHON" tools/aiter_api_layout.py check
fi

IFS=';' read -r -a archs <<<"$GPU_ARCHS"
compile_one() {  # arch source: compile, then require code for this architecture and for the host
  local arch=$1 src=$2
  local obj="$out/$arch-$(basename "$src" .cc).o"
  "$CLANG" -x hip --offload-arch="$arch" -nogpulib -fgpu-rdc -std=c++17 -O2 -fPIC \
    -D__AMDGCN_WAVEFRONT_SIZE=64 -Wall -Wextra -Werror \
    -isystem "$ffi_include" -Icsrc/include -Icsrc/aiter $mha_includes -c "$src" -o "$obj"
  /usr/lib/llvm-22/bin/clang-offload-bundler --list --type=o --input="$obj" | grep -q "amdhsa--$arch" \
    || { echo "compile-check-aiter: $obj has no $arch code" >&2; return 1; }
}
export -f compile_one
export CLANG out ffi_include mha_includes
for arch in "${archs[@]}"; do
  printf "$arch %s\n" "${sources[@]}"
done | xargs -P "$(nproc)" -L 1 bash -c 'compile_one "$0" "$1"'
echo "compile-check-aiter: ${#sources[@]} sources compiled for ${archs[*]}"
