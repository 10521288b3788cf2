#!/usr/bin/env bash
# Everything one GPU session needs, in one command (device time is scarce): build the native libraries, run the
# gpu tier of the test suite, then `jax-aiter bench` (every op against plain JAX and cuDNN, JSON and plot).
# Logs and results go to $OUT (the device tool's result folder) or ./out. BENCH=0 skips the benchmark,
# TESTS=0 the tests, BREAKDOWN=1 adds benchmarks/linear_breakdown.py; BENCH_ARGS passes options to the benchmark (e.g. "--only attention").
#   benchmarks/gpu_session.sh [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
python=$(command -v "${PYTHON:-python3}")

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  nvcc --version | tail -1
  "$python" -c "import jax; print('jax', jax.__version__, jax.devices())"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

start=$SECONDS
if ! PYTHON=$python scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  exit 1
fi
echo "build: $((SECONDS - start)) s"
export JAX_AITER_LIB_DIR=$PWD/build/dev/install/jax_aiter/lib PYTHONPATH=$PWD

if [[ ${TESTS:-1} != 0 ]]; then
  start=$SECONDS
  timeout "${TEST_TIMEOUT:-300}" "$python" -m pytest tests -m gpu -q -p no:cacheprovider \
    -rfEs "$@" >"$out/pytest_gpu.log" 2>&1
  echo "tests: exit $?, $((SECONDS - start)) s"
  tail -15 "$out/pytest_gpu.log"
fi

if [[ ${BREAKDOWN:-0} != 0 ]]; then
  timeout 120 "$python" benchmarks/linear_breakdown.py >"$out/linear_breakdown.log" 2>&1
  cat "$out/linear_breakdown.log"
fi

[[ ${BENCH:-1} == 0 ]] && exit 0
start=$SECONDS
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-420}" "$python" -m jax_aiter.cli bench --out "$out/bench" ${BENCH_ARGS:-} \
  >"$out/bench.log" 2>"$out/bench_progress.log"
echo "bench: exit $?, $((SECONDS - start)) s"
cat "$out/bench.log"
tail -3 "$out/bench_progress.log"
