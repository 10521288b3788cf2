#!/usr/bin/env bash
# One device call (under ten minutes on a fresh H200): this tree with small_plain_tiles.diff applied, built; on it,
# the per-kernel profile of the every-block step (the weights' plain dual casts on 32-row tiles), to compare by
# launch grid with ../small_casts_h200_2026-12-06/part2/profile.log; probe.py (the step's memsets with their
# neighbours, the optimized HLO of both steps); the gpu tests of test_mxfp4.py and test_gemm_fp4.py in the time left.
SECONDS=0
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
here=$PWD d=benchmarks/results/memsets_h200_2026-12-06
mkdir -p /tmp/v && tar --exclude=./build --exclude=./.git -cf - . | tar -C /tmp/v -xf -
cd /tmp/v && git apply $here/$d/small_plain_tiles.diff || exit 1
PYTHON=python3 scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/build_variant.log 2>&1
echo "build $? in $SECONDS s"
export JAX_AITER_LIB_DIR=/tmp/v/build/dev/install/jax_aiter/lib PYTHONPATH=/tmp/v
timeout 120 python3 benchmarks/train_step_profile.py $OUT/variant mxfp4-every-block > $OUT/profile_variant.log 2>&1
echo "profile exit $?"; head -1 $OUT/profile_variant.log; grep -A30 "by launch grid" $OUT/profile_variant.log | cut -c1-150
timeout 150 python3 $d/probe.py $OUT 2>&1 | grep -v Warning > $OUT/probe.log
echo "probe exit $?"; cut -c1-300 $OUT/probe.log | head -60
left=$((${LIMIT_S:-585} - SECONDS))
[ $left -gt 10 ] && timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_mxfp4.py tests/test_gemm_fp4.py \
  > $OUT/tests_variant.log 2>&1
echo "variant gpu tests exit $? (limit $left s)"; tail -3 $OUT/tests_variant.log
