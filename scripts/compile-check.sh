#!/usr/bin/env bash
# Compile checks of the GPU code that cannot run on a machine without a GPU or ROCm (CI runs `all`):
#   cuda   the single-source GPU handlers and kernels (csrc/gpu/*.cu with the *.cuh beside them) with nvcc for
#          sm_90, the Hopper target of the CUDA library; warnings and register spills fail.
#   hip    the same sources device-only with Debian's clang-22 for gfx942 and gfx950 (wave64). Debian ships no
#          ROCm device libraries for clang-22, so a device-only `-c` cannot link its code object; the check stops
#          after code generation (-S), which runs the same front end and AMDGPU back end, and reports VGPR spills
#          and whether any kernel came out as wave32.
#   aiter  the AITER bridge (csrc/aiter) as HIP for every architecture in GPU_ARCHS (see check_aiter); an AITER
#          checkout (AITER_DIR, else third_party/aiter when checked out) makes it compile against AITER's headers.
#   all    cuda, hip and aiter (the default).
# The hip and aiter modes share one toolchain: clang-22 and the HIP headers of libamdhip64-dev, installed with
# apt-get when missing (CI machines start bare; needs root or sudo).
#
#   scripts/compile-check.sh [cuda|hip|aiter|all]
#
# PYTHON picks the interpreter with jax (for the XLA FFI headers); NVCC the CUDA compiler; CLANG the clang++.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/compile-check.sh [cuda|hip|aiter|all]" >&2; exit 2; }
mode=${1:-all}
case $mode in
  cuda | hip | aiter | all) ;;
  *) usage ;;
esac
[[ $# -le 1 ]] || usage

python=${PYTHON:-python3}
[[ -x .venv/bin/python && -z ${PYTHON:-} ]] && python=.venv/bin/python
llvm_bin=/usr/lib/llvm-22/bin
clang=${CLANG:-$llvm_bin/clang++}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=$(mktemp -d "${TMPDIR:-/tmp}/compile-check.XXXXXX")
trap 'rm -rf "$out"' EXIT

xla_include=$("$python" -c "import jax.ffi; print(jax.ffi.include_dir())")
status=0

# --- the shared toolchain for hip and aiter -----------------------------------------------------------------

ensure_clang() {
  [[ -x $clang && -f /usr/include/hip/hip_runtime.h ]] && return 0
  echo "== installing clang-22, lld-22, llvm-22 and libamdhip64-dev"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang-22 lld-22 llvm-22 libamdhip64-dev >/dev/null
}

# --- cuda and hip: the single-source GPU code ---------------------------------------------------------------

gpu_sources() {
  shopt -s nullglob
  sources=(csrc/gpu/*.cu)
  shopt -u nullglob
  if [[ ${#sources[@]} -eq 0 ]]; then
    echo "compile-check: no sources in csrc/gpu/*.cu" >&2
    return 1
  fi
}

check_cuda() {
  if [[ ! -x $nvcc ]]; then
    echo "compile-check: nvcc not found (set NVCC)" >&2
    status=1
    return
  fi
  gpu_sources || { status=1; return; }
  echo "== CUDA: $($nvcc --version | tail -1) for sm_90"
  local src log
  for src in "${sources[@]}"; do
    log="$out/$(basename "$src").nvcc.log"
    if ! "$nvcc" -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Xptxas=-warn-spills,-warn-lmem-usage \
        -Werror=all-warnings -Xcompiler=-fPIC,-Wall -Icsrc/include -isystem "$xla_include" \
        -c "$src" -o "$out/$(basename "$src").o" >"$log" 2>&1; then
      cat "$log"
      echo "FAIL (nvcc) $src"
      status=1
      continue
    fi
    echo "ok   $src"
  done
}

check_hip() {
  gpu_sources || { status=1; return; }
  echo "== HIP: $($clang --version | head -1) for gfx942, gfx950"
  local src arch base asm spills
  for src in "${sources[@]}"; do
    base=$(basename "$src" .cu)
    for arch in gfx942 gfx950; do
      asm="$out/$base.$arch.s"
      if ! "$clang" -x hip --cuda-device-only -S -std=c++17 -O3 --offload-arch=$arch -nogpulib \
          -D__AMDGCN_WAVEFRONT_SIZE=64 -Wall -Werror -Wno-unused-command-line-argument \
          -Icsrc/include -isystem "$xla_include" "$src" -o "$asm" 2>"$out/$base.$arch.log"; then
        cat "$out/$base.$arch.log"
        echo "FAIL (clang $arch) $src"
        status=1
        continue
      fi
      if grep -q "\.wavefront_size:\s*32" "$asm"; then
        echo "FAIL (clang $arch) $src: a kernel was compiled for wave32"
        status=1
      fi
      # VGPR spills go to scratch memory; SGPR spills land in VGPR lanes and cost little.
      spills=$(grep -cE "^\s+\.vgpr_spill_count:\s*[1-9]" "$asm" || true)
      if [[ $spills -ne 0 ]]; then
        echo "FAIL (clang $arch) $src: $spills kernels spill registers"
        status=1
      fi
      echo "ok   $src ($arch, $(grep -cE "^\s+\.symbol:\s" "$asm" || true) kernels)"
    done
  done
}

# --- aiter: the AITER bridge --------------------------------------------------------------------------------
# csrc/aiter as HIP for every architecture in GPU_ARCHS (default "gfx942;gfx950"); no GPU needed. The ASM
# launcher and the GEMM and RMSNorm handlers need no AITER headers. The MHA handlers include AITER's
# mha_fwd.h / mha_bwd.h. With an AITER checkout (AITER_DIR, else third_party/aiter when checked out) they compile
# against its headers, and tools/aiter_api_layout.py compares the stand-ins with them; without one, against the
# stand-in declarations in tests/fixtures/aiter/api_standin, whose layout tools/aiter_api_layout.py then checks
# against the one recorded from the pinned commit's real headers.
# Objects are compiled with -fgpu-rdc: the sources are host code only (the device code is AITER's prebuilt
# code objects), and relocatable device code skips the device link, which would want ROCm's device libraries.

aiter_compile_one() {  # arch source: compile, then require code for this architecture and for the host
  local arch=$1 src=$2
  local obj="$out/aiter-$arch-$(basename "$src" .cc).o"
  "$clang" -x hip --offload-arch="$arch" -nogpulib -fgpu-rdc -std=c++17 -O2 -fPIC \
    -D__AMDGCN_WAVEFRONT_SIZE=64 -Wall -Wextra -Werror \
    -isystem "$xla_include" -Icsrc/include -Icsrc/aiter $mha_includes -c "$src" -o "$obj" || return 1
  "$llvm_bin/clang-offload-bundler" --list --type=o --input="$obj" | grep -q "amdhsa--$arch" \
    || { echo "compile-check: $obj has no $arch code" >&2; return 1; }
}

check_aiter() {
  local aiter_sources=(
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
  local archs
  IFS=';' read -r -a archs <<<"${GPU_ARCHS:-gfx942;gfx950}"
  local aiter_dir=${AITER_DIR:-}
  if [[ -z $aiter_dir && -f third_party/aiter/csrc/include/mha_fwd.h ]]; then
    aiter_dir=third_party/aiter
  fi
  if [[ -n $aiter_dir ]]; then
    if [[ ! -f $aiter_dir/csrc/include/mha_fwd.h ]]; then
      echo "compile-check: $aiter_dir is not an AITER checkout (no csrc/include/mha_fwd.h)" >&2
      status=1
      return
    fi
    # tools/aiter_hip_compat.h: what AITER's headers need beyond Debian's HIP 5.2 headers (see the file).
    mha_includes="-isystem $aiter_dir/csrc/include -include tools/aiter_hip_compat.h"
    echo "== AITER bridge: MHA handlers against the headers of $aiter_dir"
    "$python" tools/aiter_api_layout.py check --aiter "$aiter_dir" --clang "$clang" || status=1
  else
    mha_includes="-Itests/fixtures/aiter/api_standin"
    echo "== AITER bridge: no AITER checkout; MHA handlers against the stand-in declarations"
    "$python" tools/aiter_api_layout.py check || status=1
  fi
  export -f aiter_compile_one
  export clang llvm_bin out xla_include mha_includes
  local arch
  if for arch in "${archs[@]}"; do printf "$arch %s\n" "${aiter_sources[@]}"; done \
      | xargs -P "$(nproc)" -L 1 bash -c 'aiter_compile_one "$0" "$1"'; then
    echo "ok   ${#aiter_sources[@]} sources of csrc/aiter for ${archs[*]}"
  else
    echo "FAIL (clang) csrc/aiter"
    status=1
  fi
}

# --- run ----------------------------------------------------------------------------------------------------

[[ $mode == cuda ]] || ensure_clang
case $mode in
  cuda) check_cuda ;;
  hip) check_hip ;;
  aiter) check_aiter ;;
  all) check_cuda; check_hip; check_aiter ;;
esac
exit $status
