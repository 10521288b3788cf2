#!/usr/bin/env bash
# Convergence arms of the 75m model (docs/convergence.md, "H200 results") on one GPU machine in one command:
# build the native library, unpack the corpus, then train every SEED:ARM job as its own process, all at once
# (the GPU is shared: the step times in the results are not the arms' own). Each job trains into a copy of the
# committed seed directory, so its gap is taken to that seed's committed BF16 run. The jobs' directories and logs
# come back packed in $OUT/convergence.tgz (the device tool returns few files), with merged/: the finished arms
# merged into a copy of the seed directories (`jax-aiter convergence --merge-from`); the final tables go to stdout.
#   benchmarks/convergence_gpu.sh CORPUS_TXT_XZ SEED:ARM [SEED:ARM ...]
# TRAIN_LIMIT_S (default 500) stops the training processes in time for the results to be packed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
corpus_xz=$1
shift
seeds=benchmarks/results/convergence_h200_seeds
default_arm=mxfp4-signed-hadamard-bf16-last4  # PrecisionPolicy.mxfp4() on the 75m model's 12 blocks
work=/tmp/convergence
rm -rf "$work/jobs"  # a warm machine keeps /tmp: pack this call's jobs only
mkdir -p "$work"
export PYTHONUNBUFFERED=1
[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
python=$(command -v "${PYTHON:-python3}")

start=$SECONDS
xz -dc "$corpus_xz" >"$work/corpus.txt" &
if ! PYTHON=$python scripts/dev-build.sh -DJA_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$work/build.log" 2>&1; then
  tail -40 "$work/build.log"
  exit 1
fi
wait
echo "build and corpus: $((SECONDS - start)) s"
export JAX_AITER_LIB_DIR=$PWD/build/dev/install/jax_aiter/lib PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# One share of the GPU's memory per process (JAX would otherwise take 75 % of it in the first one).
export XLA_PYTHON_CLIENT_MEM_FRACTION=$(awk "BEGIN { print 0.9 / $# }")
setup=(--model 75m --data "$work/corpus.txt" --steps 2000 --batch 15 --eval-every 100 --eval-batches 8)
for job in "$@"; do
  seed=${job%%:*} arm=${job#*:}
  mkdir -p "$work/jobs/$seed-$arm"
  cp -r "$seeds/seed-$seed" "$work/jobs/$seed-$arm/seed-$seed"
  timeout "${TRAIN_LIMIT_S:-500}" "$python" -m jax_aiter.cli convergence "${setup[@]}" --seed "$seed" \
    --out "$work/jobs/$seed-$arm/seed-$seed" --arms "$arm" >"$work/jobs/$seed-$arm/log" 2>&1 &
done
wait
echo "training: $((SECONDS - start)) s"
for job in "$@"; do
  echo "== seed ${job%%:*}, ${job#*:}"
  tr '\r' '\n' <"$work/jobs/${job%%:*}-${job#*:}/log" | grep -E "^(arm|bf16|${job#*:}) |Error|error" | tail -4
done

# The finished arms, merged into one copy of the committed seed directories (seeds.json redone, paired to the
# default policy's arm), ready to copy over benchmarks/results/convergence_h200_seeds; each job's progress log
# reduced to its last progress line and its table, in merged/logs.
rm -rf "$work/merged"
cp -r "$seeds" "$work/merged"
mkdir -p "$work/merged/logs"
job_seeds=($(for job in "$@"; do echo "${job%%:*}"; done | sort -nu))
if ((${#job_seeds[@]} > 1)); then
  merge=(--seed "${job_seeds[@]}" --out "$work/merged" --merge-from "$work"/jobs/*/ --paired-to "$default_arm")
else
  merge=(--seed "${job_seeds[0]}" --out "$work/merged/seed-${job_seeds[0]}" --merge-from "$work"/jobs/*/seed-*/)
fi
"$python" -m jax_aiter.cli convergence "${setup[@]}" "${merge[@]}" >"$work/merged/logs/merge.txt" 2>&1 \
  || tail -5 "$work/merged/logs/merge.txt"
for job in "$@"; do
  lines=$(tr '\r' '\n' <"$work/jobs/${job%%:*}-${job#*:}/log")
  { grep -E "step/s" <<<"$lines" | tail -1; grep -E "^(arm|bf16|${job#*:}) " <<<"$lines"; } \
    >"$work/merged/logs/seed-${job%%:*}-${job#*:}.txt"
done
tar -C "$work" -czf "$out/convergence.tgz" jobs merged build.log
