#!/usr/bin/env bash
# One device call (under ten minutes on a fresh H200): build this tree and run `jax-aiter bench --only train` (its
# every-block row beside the same step with quantize_weights_once: bench/bench.json and the plot), then probe.py
# (the casts alone, the step's bits and profile), then the varlen probe of ../varlen_h200_2026-12-06 in the time
# left (`LIMIT_S`, default 585 s).
SECONDS=0
set -uo pipefail
export PYTHONUNBUFFERED=1
TESTS=0 BENCH_ARGS="--only train" BENCH_TIMEOUT=300 benchmarks/gpu_session.sh
export JAX_AITER_LIB_DIR=$PWD/build/dev/install/jax_aiter/lib PYTHONPATH=$PWD
mkdir -p $OUT/grouped $OUT/varlen
timeout 200 python3 benchmarks/results/grouped_casts_h200_2026-12-06/probe.py $OUT/grouped 2>&1 | grep -v Warning \
  > $OUT/grouped/probe.log
echo "grouped-casts probe exit $? at $SECONDS s"; cut -c1-160 $OUT/grouped/probe.log | tail -45
left=$((${LIMIT_S:-585} - SECONDS))
[ $left -gt 60 ] && timeout $left python3 benchmarks/results/varlen_h200_2026-12-06/probe.py $OUT/varlen \
  > $OUT/varlen/probe.log 2>&1
echo "varlen probe exit $? (limit $left s)"; grep -v Warning $OUT/varlen/probe.log | cut -c1-160 | head -60
