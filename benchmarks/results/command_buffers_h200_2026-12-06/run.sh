#!/usr/bin/env bash
# Our GPU handlers in XLA's command buffers, on one H200, in device calls of at most ten minutes each:
#   run.sh 1   build; the gpu tests of the casts and the MXFP4 GEMMs (the CUDA-graph test among them); probe.py
#   run.sh 2   `bench --only train` and the per-kernel profile of the BF16 and every-block MXFP4 steps
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
part=$1
export OUT=$OUT/part$part
case $part in
  1) BENCH=0 TEST_TIMEOUT=160 "$root/benchmarks/gpu_session.sh" -k "test_mxfp4 or test_gemm_fp4"
     start=$SECONDS
     JAX_AITER_LIB_DIR=$root/build/dev/install/jax_aiter/lib PYTHONPATH=$root \
       timeout 290 python3 "$here/probe.py" "$OUT" > "$OUT/probe.log" 2>&1
     echo "probe: exit $?, $((SECONDS - start)) s"
     cut -c1-300 "$OUT/probe.log" ;;
  2) TESTS=0 BENCH_ARGS="--only train" BENCH_TIMEOUT=240 "$root/benchmarks/gpu_session.sh"
     start=$SECONDS
     JAX_AITER_LIB_DIR=$root/build/dev/install/jax_aiter/lib PYTHONPATH=$root \
       timeout 120 python3 "$root/benchmarks/train_step_profile.py" "$OUT/profile" bf16,mxfp4-every-block \
       > "$OUT/profile.log" 2>&1
     echo "profile: exit $?, $((SECONDS - start)) s"
     grep -A12 "step" "$OUT/profile.log" | cut -c1-160 ;;
esac
