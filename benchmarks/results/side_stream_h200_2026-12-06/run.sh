#!/usr/bin/env bash
# One device call (under ten minutes on a fresh H200): build this tree, run probe.py (the weights' casts on a
# second stream), then the varlen probe of ../varlen_h200_2026-12-06 (no build needed) in the time left.
SECONDS=0
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
here=benchmarks/results/side_stream_h200_2026-12-06
PYTHON=python3 scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/build.log 2>&1
echo "build $? in $SECONDS s"
export JAX_AITER_LIB_DIR=$PWD/build/dev/install/jax_aiter/lib PYTHONPATH=$PWD
timeout 300 python3 $here/probe.py $OUT 2>&1 | grep -v Warning > $OUT/probe.log
echo "side-stream probe exit $? at $SECONDS s"; cut -c1-240 $OUT/probe.log | tail -40
left=$((${LIMIT_S:-585} - SECONDS))
mkdir -p $OUT/varlen
[ $left -gt 60 ] && timeout $left python3 benchmarks/results/varlen_h200_2026-12-06/probe.py $OUT/varlen \
  > $OUT/varlen/probe.log 2>&1
echo "varlen probe exit $? (limit $left s)"; grep -v Warning $OUT/varlen/probe.log | cut -c1-160 | head -60
