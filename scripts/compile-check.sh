#!/usr/bin/env bash
# Compile check of the single-source GPU code (csrc/ffi/*.cu with csrc/kernels/*.cuh), run by CI on machines
# without a GPU or ROCm:
#   * CUDA: every source with nvcc for sm_90 (the Hopper target of the CUDA library); register spills fail.
#   * HIP:  every source device-only with Debian's clang-22 for gfx942 and gfx950 (wave64).
# Debian ships no ROCm device libraries for clang-22, so a device-only `-c` cannot link its code object; the
# check stops after code generation (-S), which runs the same front end and AMDGPU back end, and reports
# VGPR spills and whether any kernel came out as wave32.
# Installs clang-22 and the HIP headers with apt-get when they are missing (CI machines start bare).
# Usage: scripts/compile-check.sh [cuda|hip|all]   (default all; PYTHON picks the interpreter with jax)
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
python=${PYTHON:-python3}
[[ -x .venv/bin/python && -z ${PYTHON:-} ]] && python=.venv/bin/python
clang=/usr/lib/llvm-22/bin/clang++
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

xla_include=$("$python" -c "import jax.ffi; print(jax.ffi.include_dir())")
sources=(csrc/ffi/*.cu)
status=0

check_cuda() {
  if [[ ! -x $nvcc ]]; then
    echo "compile-check: nvcc not found (set NVCC)" >&2
    return 1
  fi
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

ensure_clang() {
  [[ -x $clang && -f /usr/include/hip/hip_runtime.h ]] && return 0
  echo "== installing clang-22 and the HIP headers"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang-22 lld-22 llvm-22 libamdhip64-dev >/dev/null
}

check_hip() {
  ensure_clang
  echo "== HIP: $($clang --version | head -1) for gfx942, gfx950"
  local src arch base asm
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
      local spills
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

case $what in
  cuda) check_cuda ;;
  hip) check_hip ;;
  all) check_cuda; check_hip ;;
  *) echo "usage: $0 [cuda|hip|all]" >&2; exit 2 ;;
esac
exit $status
