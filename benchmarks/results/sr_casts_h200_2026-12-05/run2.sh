#!/usr/bin/env bash
# The second device call: the committed kernel structure (new) and the tree before the change (old: .devcarry/old's
# two headers) built side by side; gpu tests of the casts and GEMMs on new; the cast timings of new; the training
# steps (`jax-aiter bench --only train`, with the stochastic-gradient arm) of each library in its own process.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
here=$PWD d=benchmarks/results/sr_casts_h200_2026-12-05
o=$OUT/second && mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $o/gpu.txt
mkdir -p /tmp/old && tar --exclude=./build --exclude=./.git -cf - . | tar -C /tmp/old -xf -
cp .devcarry/old/mxfp4.cuh /tmp/old/csrc/gpu/mxfp4.cuh
cp .devcarry/old/mxfp4_codec.h /tmp/old/csrc/include/jax_aiter/mxfp4_codec.h
start=$SECONDS
for t in $here /tmp/old; do
  (cd $t && PYTHON=python3 scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > build.log 2>&1; echo "$t build $?") &
done
wait
echo "builds $((SECONDS - start)) s"
lib() { echo $1/build/dev/install/jax_aiter/lib; }
start=$SECONDS
PYTHONPATH=$here JAX_AITER_LIB_DIR=$(lib $here) timeout 200 python3 -m pytest tests/test_mxfp4.py tests/test_gemm_fp4.py \
  -m gpu -q -p no:cacheprovider -rfEs > $o/pytest_gpu_mxfp4_gemm_fp4.log 2>&1
echo "tests exit $? $((SECONDS - start)) s"; tail -2 $o/pytest_gpu_mxfp4_gemm_fp4.log
PYTHONPATH=$here JAX_AITER_LIB_DIR=$(lib $here) timeout 100 python3 $d/cast_ab.py $o new 2>&1 | grep -v Warning | tee $o/cast_ab.log
for v in new old; do
  t=$here; [[ $v == old ]] && t=/tmp/old
  start=$SECONDS
  (cd $t && PYTHONPATH=$t JAX_AITER_LIB_DIR=$(lib $t) timeout 150 python3 -m jax_aiter.cli bench --only train \
    --out $o/train_$v > $o/train_$v.log 2> $o/train_${v}_progress.log)
  echo "train $v exit $? $((SECONDS - start)) s"; grep -E "bf16|mxfp4|fp8" $o/train_$v.log | head -8
done
