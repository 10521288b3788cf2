"""``jax-aiter recipe``: print a resolved recipe run (``--dry-run``, no jax), or run it.

A run refuses an output directory that exists and is not empty, writes the banner (``banner.txt``), the resolved
run (``resolved.json``) and the versions and commits of everything it runs with (``versions.json``), then trains
in a child process (``python -m jax_aiter.maxtext._train``) started with the run's XLA flags and environment,
whose output goes to the terminal and to ``train.log`` (with a closing phase, a second child resumes from the
first one's checkpoint and writes its MLPerf log to ``mllog-closing.txt``); the child first checks that jax sees the recipe's number
of devices of the recipe's hardware, and exits with a message (status 1) if not. MaxText writes the MLPerf log
``mllog.txt``, whose ``tracked_stats`` events carry each step's training loss. (MaxText 0.2.5's ``metrics_file``
is not used: its writer empties the file whenever an evaluation's first step is written.) A failed run (an OOM
included) is not retried: its directory keeps the banner and the logs, and the next attempt takes a fresh
``--out``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from jax_aiter.maxtext._resolve import TESTED_MAXTEXT_VERSIONS, RecipeRun, resolve

__all__ = ["recipe_command", "run", "versions"]

# The distributions whose versions a run records (absent ones as null).
_DISTRIBUTIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
                  "jax-rocm7-plugin", "jax-rocm7-pjrt", "flax", "optax", "orbax-checkpoint", "maxtext", "qwix",
                  "aqtp", "tokamax", "grain", "mlperf-logging", "numpy", "ml_dtypes")


def _distribution(name: str) -> dict | None:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    # direct_url.json names the commit of a package installed from a repository or a local checkout.
    direct_url = dist.read_text("direct_url.json")
    return {"version": dist.version, "direct_url": json.loads(direct_url) if direct_url else None}


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def versions() -> dict:
    """Python, the platform, the recorded distributions, and jax-aiter's version, source folder, git commit (with
    whether the tree has local changes) and pinned AITER commit."""
    import jax_aiter
    from jax_aiter.aiter import manifest

    source = Path(jax_aiter.__file__).resolve().parent
    commit = _git(source, "rev-parse", "HEAD")
    status = _git(source, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "python": sys.version,
        "platform": platform.platform(),
        "distributions": {name: _distribution(name) for name in _DISTRIBUTIONS},
        "jax_aiter": {"version": jax_aiter.__version__, "source": str(source), "git_commit": commit,
                      "git_local_changes": bool(status) if commit else None,
                      "native_library_dir": os.environ.get("JAX_AITER_LIB_DIR"),
                      "aiter_commit": manifest.PINNED_AITER_COMMIT},
    }


def run(recipe_run: RecipeRun) -> int:
    """Run ``recipe_run`` as the module docstring says; the child's exit status."""
    out = recipe_run.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out}: exists and is not an empty directory; a recipe run never reuses an "
                              "output directory (pass a fresh one)")
    if recipe_run.maxtext_version is None:
        raise RuntimeError("MaxText is not installed (pip install 'jax-aiter[maxtext]')")
    if recipe_run.maxtext_version not in TESTED_MAXTEXT_VERSIONS:
        raise RuntimeError(f"MaxText {recipe_run.maxtext_version} is not a version jax_aiter.maxtext was tested "
                           f"with ({', '.join(TESTED_MAXTEXT_VERSIONS)})")
    if importlib.util.find_spec("mlperf_logging") is None:
        raise RuntimeError("the MLPerf log needs the mlperf-logging package (pip install 'jax-aiter[maxtext]')")
    out.mkdir(parents=True, exist_ok=True)
    banner = recipe_run.banner()
    (out / "banner.txt").write_text(banner)
    (out / "resolved.json").write_text(json.dumps(recipe_run.as_json(), indent=2) + "\n")
    (out / "versions.json").write_text(json.dumps(versions(), indent=2) + "\n")
    sys.stdout.write(banner)
    sys.stdout.flush()
    env = {**os.environ, **dict(recipe_run.environment), "XLA_FLAGS": " ".join(recipe_run.xla_flags)}
    with open(out / "train.log", "w", encoding="utf8") as log:
        for phase, mode in enumerate(recipe_run.phase_modes):
            if phase:
                line = (f"jax-aiter recipe: closing phase, steps {recipe_run.final_from}-{recipe_run.steps - 1} in "
                        f"mode {mode}, resumed from the checkpoint of step {recipe_run.final_from - 1}\n")
                sys.stdout.write(line)
                log.write(line)
            command = [sys.executable, "-m", "jax_aiter.maxtext._train", str(out / "resolved.json"), str(phase)]
            with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) as child:
                for line in child.stdout:
                    sys.stdout.write(line)
                    log.write(line)
            if child.returncode:
                sys.stderr.write(f"jax-aiter recipe: training exited with status {child.returncode}; {out} keeps "
                                 "the banner and the logs; start the next attempt with a fresh --out\n")
                return child.returncode
    return 0


def recipe_command(args: argparse.Namespace) -> int:
    """``jax-aiter recipe`` (arguments: jax_aiter/cli.py)."""
    final_fraction = args.final_fraction
    if final_fraction is None and args.final_mode is not None:
        final_fraction = 0.25  # PrecisionSchedule.mxfp4_then_fp8's closing phase
    try:
        recipe_run = resolve(args.recipe, args.mode, args.out, steps=args.steps, data=args.data,
                             eval_data=args.eval_data, eod_id=args.eod_id, dump_hlo=args.dump_hlo,
                             overrides=args.set or (), environ_xla_flags=os.environ.get("XLA_FLAGS", ""),
                             final_mode=args.final_mode, final_fraction=final_fraction)
    except ValueError as err:
        sys.stderr.write(f"jax-aiter recipe: {err}\n")
        return 2
    if args.dry_run:
        sys.stdout.write(recipe_run.banner())
        return 0
    return run(recipe_run)
