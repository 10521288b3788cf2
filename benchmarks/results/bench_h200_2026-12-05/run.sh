#!/usr/bin/env bash
# The whole `jax-aiter bench` of one tree on one H200, in device calls of at most ten minutes each:
#   run.sh 1   build; the gpu tests of the casts and the MXFP4 GEMMs; `bench --only kernels linear`
#   run.sh 2   `bench --only attention block` (builds again on a fresh machine)
#   run.sh 3   the gpu tests of the casts and MXFP4 GEMMs again, `bench --only train` and the per-kernel profile of
#              the BF16 and every-block MXFP4 steps
set -uo pipefail
part=$1
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
out=$OUT/part$part
mkdir -p $out
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import jax; print('jax', jax.__version__)"; git log -1 --format=%H; git status --short; } > $out/gpu.txt
start=$SECONDS
if [[ ! -f build/dev/install/jax_aiter/lib/libjax_aiter_cuda.so ]] || [[ $part == 1 ]]; then
  PYTHON=python3 scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $out/build.log 2>&1 \
    || { tail -30 $out/build.log; exit 1; }
fi
echo "build $((SECONDS - start)) s"
export PYTHONPATH=$PWD JAX_AITER_LIB_DIR=$PWD/build/dev/install/jax_aiter/lib
bench() {  # sections, time limit
  local start=$SECONDS
  timeout $2 python3 -m jax_aiter.cli bench --only $1 --out $out/bench > $out/bench.log 2> $out/bench_progress.log
  echo "bench $1: exit $? $((SECONDS - start)) s"; cat $out/bench.log; tail -2 $out/bench_progress.log
}
tests() {
  local start=$SECONDS
  timeout 200 python3 -m pytest tests/test_mxfp4.py tests/test_gemm_fp4.py -m gpu -q -p no:cacheprovider -rfEs \
    > $out/pytest_gpu_mxfp4_gemm_fp4.log 2>&1
  echo "tests exit $? $((SECONDS - start)) s"; tail -3 $out/pytest_gpu_mxfp4_gemm_fp4.log
}
case $part in
  1) tests
     bench "kernels linear" 380 ;;
  2) bench "attention block" 540 ;;
  3) tests
     bench train 240
     start=$SECONDS
     timeout 120 python3 benchmarks/train_step_profile.py $out/profile bf16,mxfp4-every-block > $out/profile.log 2>&1
     echo "profile exit $? $((SECONDS - start)) s"; grep -A12 "step" $out/profile.log | cut -c1-160 ;;
esac
