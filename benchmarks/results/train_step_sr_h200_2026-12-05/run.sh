#!/usr/bin/env bash
# One device call: build this tree (new) and the tree before the stochastic kernels (old: .devcarry/old's two
# headers, from 9becd0d~1); the casts' and GEMMs' gpu tests on new; `jax-aiter bench --only train` on new; the
# per-kernel step profile of bf16, mxfp4-every-block and mxfp4-sr-grad on new and of mxfp4-sr-grad on old.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
here=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 -c "import jax; print('jax', jax.__version__)" >> $OUT/gpu.txt
git log -1 --format=%H >> $OUT/gpu.txt; git status --short >> $OUT/gpu.txt
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
export PYTHONPATH=$here JAX_AITER_LIB_DIR=$(lib $here)
start=$SECONDS
timeout 200 python3 -m pytest tests/test_mxfp4.py tests/test_gemm_fp4.py -m gpu -q -p no:cacheprovider -rfEs \
  > $OUT/pytest_gpu_mxfp4_gemm_fp4.log 2>&1
echo "tests exit $? $((SECONDS - start)) s"; tail -2 $OUT/pytest_gpu_mxfp4_gemm_fp4.log
start=$SECONDS
timeout 200 python3 -m jax_aiter.cli bench --only train --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench exit $? $((SECONDS - start)) s"; tail -8 $OUT/bench.log
start=$SECONDS
timeout 120 python3 benchmarks/train_step_profile.py $OUT/profile_new bf16,mxfp4-every-block,mxfp4-sr-grad \
  > $OUT/profile_new.log 2>&1
echo "profile new exit $? $((SECONDS - start)) s"; grep "step" $OUT/profile_new.log | head
(cd /tmp/old && PYTHONPATH=/tmp/old JAX_AITER_LIB_DIR=$(lib /tmp/old) timeout 80 python3 benchmarks/train_step_profile.py \
  $OUT/profile_old mxfp4-sr-grad) > $OUT/profile_old.log 2>&1
echo "profile old exit $?"; grep "step" $OUT/profile_old.log | head
