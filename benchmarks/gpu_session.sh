#!/usr/bin/env bash
# Everything one GPU session needs, in one command (device time is scarce): build the native libraries,
# run the gpu tier of the test suite, run benchmarks/bench_kernels.py. Logs and the benchmark
# JSON go to $OUT (the device tool's result folder) or ./out. BENCH=0 skips the benchmark.
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
if ! PYTHON=$python scripts/dev-build.sh -DJA_ENABLE_CUDA=ON >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  exit 1
fi
echo "build: $((SECONDS - start)) s"
export JAX_AITER_LIB_DIR=$PWD/build/dev/install/jax_aiter/lib PYTHONPATH=$PWD

start=$SECONDS
timeout "${TEST_TIMEOUT:-300}" "$python" -m pytest tests -m gpu -q -p no:cacheprovider \
  -rfEs "$@" >"$out/pytest_gpu.log" 2>&1
echo "tests: exit $?, $((SECONDS - start)) s"
tail -15 "$out/pytest_gpu.log"

[[ ${BENCH:-1} == 0 ]] && exit 0
start=$SECONDS
timeout "${BENCH_TIMEOUT:-300}" "$python" benchmarks/bench_kernels.py --out "$out/bench_kernels.json" \
  >"$out/bench.log" 2>&1
echo "bench: exit $?, $((SECONDS - start)) s"
cat "$out/bench.log"
