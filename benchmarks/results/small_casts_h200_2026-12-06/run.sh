#!/usr/bin/env bash
# 32-row cast tiles on one H200, in device calls of at most ten minutes each:
#   run.sh 1   (as it ran, on the tree of the change before its tile rule: kSmallCastTiles, replaced since by
#              cast_tile_rows' rule) build this tree twice, with every 16-bit cast on 32-row tiles (t32: kSmallCastTiles above any grid)
#              and with none (t64: kSmallCastTiles = 0), and the tree before (old: .devcarry/old/mxfp4.cuh, the
#              kernels of main 7137f53, carried); the gpu tests of the casts and MXFP4 GEMMs on t32 and t64 (so that
#              both tile heights are byte-exact on every test shape); the cast timings of each library in its own
#              process
#   run.sh 2   this tree as it is (32-row tiles where the columnwise copy is rotated, set from part 1):
#              `bench --only train`, the per-kernel profile of the BF16 and every-block steps, the gpu tests of the
#              casts and MXFP4 GEMMs, the cast timings
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
here=$PWD d=benchmarks/results/small_casts_h200_2026-12-06
if [[ $1 == 2 ]]; then
  export OUT=$OUT/part2
  TESTS=0 BENCH_ARGS="--only train" BENCH_TIMEOUT=240 benchmarks/gpu_session.sh
  start=$SECONDS
  JAX_AITER_LIB_DIR=$here/build/dev/install/jax_aiter/lib PYTHONPATH=$here \
    timeout 120 python3 benchmarks/train_step_profile.py "$OUT/profile" bf16,mxfp4-every-block > "$OUT/profile.log" 2>&1
  echo "profile: exit $?, $((SECONDS - start)) s"
  grep -A12 "step" "$OUT/profile.log" | cut -c1-160
  JAX_AITER_LIB_DIR=$here/build/dev/install/jax_aiter/lib PYTHONPATH=$here timeout 100 python3 -m pytest tests/test_mxfp4.py tests/test_gemm_fp4.py -m gpu -q -p no:cacheprovider -rfEs \
    > $OUT/pytest_gpu.log 2>&1
  echo "tests exit $?"; tail -n 2 $OUT/pytest_gpu.log
  JAX_AITER_LIB_DIR=$here/build/dev/install/jax_aiter/lib PYTHONPATH=$here timeout 60 python3 $d/cast_ab.py $OUT final \
    2>&1 | grep -v Warning | tee $OUT/cast_ab.log
  exit 0
fi
export OUT=$OUT/part1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 -c "import jax; print('jax', jax.__version__)" >> $OUT/gpu.txt
declare -A tiles=([t32]="int64_t{1} << 40" [t64]="0")
for v in t32 t64 old; do
  mkdir -p /tmp/$v && tar --exclude=./build --exclude=./.git -cf - . | tar -C /tmp/$v -xf -
  if [[ $v == old ]]; then cp .devcarry/old/mxfp4.cuh /tmp/old/csrc/gpu/mxfp4.cuh; continue; fi
  sed -i "s/kSmallCastTiles = 1024;/kSmallCastTiles = ${tiles[$v]};/" /tmp/$v/csrc/gpu/mxfp4.cuh
  grep -n "kSmallCastTiles = " /tmp/$v/csrc/gpu/mxfp4.cuh >> $OUT/gpu.txt
done
start=$SECONDS
for v in t32 t64 old; do
  (cd /tmp/$v && PYTHON=python3 scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/build_$v.log 2>&1; echo "$v build $?") &
done
wait
echo "builds $((SECONDS - start)) s"
lib() { echo /tmp/$1/build/dev/install/jax_aiter/lib; }
start=$SECONDS
for v in t32 t64; do
  (cd /tmp/$v && PYTHONPATH=/tmp/$v JAX_AITER_LIB_DIR=$(lib $v) XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout 240 \
    python3 -m pytest tests/test_mxfp4.py tests/test_gemm_fp4.py -m gpu -q -p no:cacheprovider -rfEs \
    > $OUT/pytest_gpu_$v.log 2>&1; echo "$v tests exit $?") &
done
wait
echo "tests $((SECONDS - start)) s"; tail -n 2 $OUT/pytest_gpu_t*.log
for v in t32 t64 old; do
  (cd /tmp/$v && PYTHONPATH=/tmp/$v JAX_AITER_LIB_DIR=$(lib $v) timeout 120 python3 $here/$d/cast_ab.py $OUT $v) 2>&1 \
    | grep -v Warning | tee -a $OUT/cast_ab.log
done
