#!/usr/bin/env bash
# One device call: build this tree (new), the tree before the change (old: .devcarry/old's two headers) and the new
# tree with the stochastic kernels at the default launch bounds (lb1); gpu tests of the casts and GEMMs on new; the
# cast timings of each library in its own process.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
here=$PWD d=benchmarks/results/sr_casts_h200_2026-12-05
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 -c "import jax; print('jax', jax.__version__)" >> $OUT/gpu.txt
for v in old lb1; do
  mkdir -p /tmp/$v && tar --exclude=./build --exclude=./.git -cf - . | tar -C /tmp/$v -xf -
done
cp .devcarry/old/mxfp4.cuh /tmp/old/csrc/gpu/mxfp4.cuh
cp .devcarry/old/mxfp4_codec.h /tmp/old/csrc/include/jax_aiter/mxfp4_codec.h
sed -i 's/__launch_bounds__(kCastThreads, kStochastic ? 3 : 1)/__launch_bounds__(kCastThreads)/' /tmp/lb1/csrc/gpu/mxfp4.cuh
grep -c "kStochastic ? 3" /tmp/lb1/csrc/gpu/mxfp4.cuh >> $OUT/gpu.txt
start=$SECONDS
for t in $here /tmp/old /tmp/lb1; do
  (cd $t && PYTHON=python3 scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > build.log 2>&1; echo "$t build $?") &
done
wait
echo "builds $((SECONDS - start)) s"
lib() { echo $1/build/dev/install/jax_aiter/lib; }
start=$SECONDS
PYTHONPATH=$here JAX_AITER_LIB_DIR=$(lib $here) timeout 240 python3 -m pytest tests/test_mxfp4.py tests/test_gemm_fp4.py \
  -m gpu -q -p no:cacheprovider -rfEs > $OUT/pytest_gpu_mxfp4_gemm_fp4.log 2>&1
echo "tests exit $? $((SECONDS - start)) s"; tail -3 $OUT/pytest_gpu_mxfp4_gemm_fp4.log
for v in new old lb1; do
  t=$here; [[ $v != new ]] && t=/tmp/$v
  (cd $t && PYTHONPATH=$t JAX_AITER_LIB_DIR=$(lib $t) timeout 150 python3 $here/$d/cast_ab.py $OUT $v) 2>&1 | grep -v Warning | tee -a $OUT/cast_ab.log
done
