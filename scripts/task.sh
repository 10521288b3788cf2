#!/usr/bin/env bash
# The one place that maps a project task to its command. scripts/plain.sh (a plain machine: .venv, no conda)
# and the pixi tasks (pixi.toml) both end here, so a task runs the same steps on either path.
#
#   bash scripts/task.sh <task> [args...]        arguments go to the task's command
#   bash scripts/task.sh --list                  the task names
#   bash scripts/task.sh --needs-package <task>  exit 0 when the task runs the installed jax-aiter (plain.sh
#                                                installs it first), 1 when not, 2 for an unknown task
#
# PYTHON names the interpreter (default: python on PATH). Tasks that run jax_aiter (test, demo, info, bench)
# import the package installed in that interpreter's environment, never the source tree's jax_aiter/ (which has
# no native libraries): tests start in tests/, the commands in an empty directory outside the tree, and
# bench writes its JSON and plot into bench-out/ in the repository (its --out overrides that).
set -euo pipefail

# name          package  what it runs
TASKS="
build           no       pip install --no-build-isolation --no-deps . (builds the native libraries against this
                         environment's jax headers and installs jax-aiter)
test            yes      pytest on the installed package, started from tests/; GPU tests skip without a GPU
demo            yes      jax-aiter demo: the backend table, then the tiny Llama-style model trains
info            yes      jax-aiter info: which implementation every op takes on this machine, and why
bench           yes      jax-aiter bench: every op against plain JAX and cuDNN in one process (table, JSON, plot)
conda-build     yes      scripts/conda_build.py: the conda packages (no arguments: the offline cpu packages)
build-aiter     no       scripts/build-aiter.sh: build and stage AITER's libraries (ROCm machine)
dev-build       no       scripts/dev-build.sh: the native libraries into build/dev, for JAX_AITER_LIB_DIR
compile-check   no       scripts/compile-check.sh cuda|hip|aiter|all: the GPU sources compiled without a GPU
"

names() { awk '/^[a-z]/ {print $1}' <<<"$TASKS"; }
known() { names | grep -qxF -- "$1"; }
usage() {
  echo "usage: scripts/task.sh <task> [args...]"
  echo "tasks (\"package\": runs the installed jax-aiter):$TASKS"
}

case ${1:-} in
  "") usage >&2; exit 2 ;;
  -h | --help) usage; exit 0 ;;
  --list) names; exit 0 ;;
  --needs-package)
    known "${2:-}" || { echo "task.sh: unknown task '${2:-}'" >&2; exit 2; }
    [[ $(awk -v t="$2" '/^[a-z]/ && $1 == t {print $2}' <<<"$TASKS") == yes ]]
    exit ;;
esac
task=$1
shift
if ! known "$task"; then
  echo "task.sh: unknown task '$task' (tasks: $(names | paste -sd ' '))" >&2
  exit 2
fi

# The interpreter, as an absolute path (a relative PYTHON is relative to the caller's directory).
python=${PYTHON:-python}
if [[ $python == */* ]]; then
  [[ $python == /* ]] || python=$PWD/$python
else
  python=$(command -v "$python") || { echo "task.sh: no '$python' on PATH (set PYTHON)" >&2; exit 1; }
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

installed_cli() {  # jax-aiter's command line from an empty directory outside the tree
  local dir rc=0
  dir=$(mktemp -d "${TMPDIR:-/tmp}/jax-aiter-task.XXXXXX")
  (cd "$dir" && "$python" -c "import jax_aiter" 2>/dev/null) || {
    rm -rf "$dir"
    echo "task.sh: jax-aiter is not installed for $python (scripts/task.sh build, pixi run build," \
         "or scripts/plain.sh $task)" >&2
    return 1
  }
  (cd "$dir" && "$python" -m jax_aiter.cli "$@") || rc=$?
  rm -rf "$dir"
  return $rc
}

case $task in
  build) exec "$python" -m pip install --no-build-isolation --no-deps . "$@" ;;
  test) cd tests && exec "$python" -m pytest -p no:cacheprovider --rootdir=.. -c ../pyproject.toml "$@" . ;;
  demo) installed_cli demo "$@" ;;
  info) installed_cli info "$@" ;;
  bench) installed_cli bench --out "$root/bench-out" "$@" ;;
  conda-build) exec "$python" scripts/conda_build.py "$@" ;;
  build-aiter) PYTHON=$python; export PYTHON; exec bash scripts/build-aiter.sh "$@" ;;
  dev-build) PYTHON=$python; export PYTHON; exec bash scripts/dev-build.sh "$@" ;;
  compile-check) PYTHON=$python; export PYTHON; exec bash scripts/compile-check.sh "$@" ;;
  *) echo "task.sh: task '$task' is listed but has no command" >&2; exit 2 ;;
esac
