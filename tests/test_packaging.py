"""Packaging: the conda recipe (recipe/), its CI-only offline build, and the pixi workspace (docs/packaging.md).

The fast tests render the recipe's cpu, cuda and rocm variants (no build, no channel) and read pixi.toml. The slow
ones build the offline cpu packages once with scripts/conda_build.py (one to three minutes on two cores; the
build also runs the recipe's own tests), inspect them, and install them with py-rattler into a fresh prefix from the
local output channel alone, where recipe/tests/check_*.py run an op and attention from the installed files.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

# The conda tooling comes with the test extra (pyproject.toml); machines without it skip this file.
rattler = pytest.importorskip("rattler")
Package = pytest.importorskip("rattler_build").Package
import rattler.package_streaming  # noqa: E402
from packaging.requirements import Requirement  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
SITE = "lib/python3.12/site-packages"
CHECKS = ROOT / "recipe" / "tests"


_spec = importlib.util.spec_from_file_location("conda_build", ROOT / "scripts" / "conda_build.py")
conda_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conda_build)


def _is_mha(path: str) -> bool:
    """The attention part of the project: jax_aiter/mha/, shared libraries named for MHA, and the recipe test
    files that rattler-build stores in jax-aiter-mha."""
    return (path.startswith((f"{SITE}/jax_aiter/mha/", "etc/conda/test-files/jax-aiter-mha/"))
            or (path.endswith(".so") and "mha" in path.rsplit("/", 1)[-1]))


# --- rendering: every backend, no build ------------------------------------------------------------------


def _rendered(backend: str) -> dict:
    return {variant.recipe.package.name: variant for variant in conda_build.render(backend)}


def _exact_pin(variant, name: str) -> bool:
    return {"pin_subpackage": {"name": name, "exact": True}} in variant.recipe.requirements.run


# ids that are not bare backend names: conftest.py skips tests whose keywords include "rocm" on machines without one.
@pytest.mark.parametrize("backend", ["cpu", "cuda", "rocm"], ids=lambda backend: f"{backend}-variant")
def test_rendered_variant_outputs_and_requirements(backend):
    packages = _rendered(backend)
    expected = {"jax-aiter-core", "jax-aiter-mha"} | ({"aiter-jit-libs"} if backend == "rocm" else set())
    assert set(packages) == expected
    for variant in packages.values():
        assert variant.recipe.package.version == VERSION
        assert variant.recipe.build.string.startswith(f"{backend}_py312h")

    core, mha = packages["jax-aiter-core"], packages["jax-aiter-mha"]
    assert _exact_pin(mha, "jax-aiter-core")
    assert mha.variant["jax-aiter-core"] == f"{VERSION} {core.recipe.build.string}"
    run = [spec for spec in core.recipe.requirements.run if isinstance(spec, str)]
    assert "python 3.12.*" in run
    # Every runtime dependency pyproject.toml declares is a conda requirement too.
    for dependency in PYPROJECT["project"]["dependencies"]:
        name = Requirement(dependency).name
        assert any(spec.split()[0] == name for spec in run), f"{name} missing from jax-aiter-core's run requirements"

    staging = core.recipe.staging_caches[0].requirements
    assert {"cmake >=3.24", "ninja", "gxx_linux-64 14.*", "sysroot_linux-64 2.28.*"} <= set(staging.build)
    assert {"python 3.12.*", "pip", "scikit-build-core >=0.10", "jax >=0.11", "jaxlib >=0.11"} <= set(staging.host)
    if backend == "cuda":
        assert "cuda-nvcc_linux-64 12.9.*" in staging.build
        assert {"cuda-version 12.9.*", "cuda-cudart-dev"} <= set(staging.host)
        assert "jaxlib >=0.11 *cuda*" in run
    else:
        assert not any("cuda" in spec for spec in staging.build + staging.host + run)
    if backend == "rocm":
        jit_libs = packages["aiter-jit-libs"]
        assert _exact_pin(core, "aiter-jit-libs")
        assert core.variant["aiter-jit-libs"] == f"{VERSION} {jit_libs.recipe.build.string}"
        run_exports = jit_libs.recipe.to_dict()["requirements"]["run_exports"]
        assert run_exports == {"weak": [{"pin_subpackage": {"name": "aiter-jit-libs", "exact": True}}]}


def test_build_strings_differ_across_variants():
    strings = [v.recipe.build.string for backend in ("cpu", "cuda", "rocm") for v in _rendered(backend).values()]
    strings += [v.recipe.build.string for v in conda_build.render("cpu", offline=True)]
    assert len(strings) == len(set(strings)), strings


# --- pixi workspace --------------------------------------------------------------------------------------


def test_pixi_tasks_call_files_that_exist():
    pixi = tomllib.loads((ROOT / "pixi.toml").read_text())
    assert pixi["workspace"]["channels"] == ["conda-forge"]
    assert pixi["workspace"]["platforms"] == ["linux-64"]
    assert set(pixi["environments"]) == {"default", "cuda", "rocm"}
    for features in pixi["environments"].values():
        assert set(features) <= set(pixi["feature"])

    tasks = dict(pixi["tasks"])
    for feature in pixi["feature"].values():
        tasks.update(feature.get("tasks", {}))
    assert {"build", "test", "demo", "bench", "conda-build"} <= set(tasks)
    for name, task in tasks.items():
        task = {"cmd": task} if isinstance(task, str) else task
        words = shlex.split(task["cmd"])
        paths = [word for word in words if word == "." or "/" in word]
        assert paths, f"pixi task {name!r} names no file of the project: {task['cmd']}"
        for path in paths:
            assert (ROOT / path).exists(), f"pixi task {name!r} calls {path}, which does not exist"
        for dependency in task.get("depends-on", []):
            assert dependency in tasks, f"pixi task {name!r} depends on unknown task {dependency!r}"
    for name in ("build", "test", "demo", "bench", "conda-build"):
        assert shlex.split(tasks[name]["cmd"]) == ["bash", "scripts/task.sh", name]


# --- the offline cpu build -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offline_channel(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("conda-channel")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "conda_build.py"), "--output-dir", str(output)],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"scripts/conda_build.py failed:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return output


@pytest.fixture(scope="module")
def packages(offline_channel) -> dict[str, Package]:
    return {p.name: p for p in map(Package.from_file, sorted((offline_channel / "linux-64").glob("*.conda")))}


@pytest.mark.slow
def test_offline_packages_names_versions_and_pins(packages, tmp_path):
    assert set(packages) == {"jax-aiter-core", "jax-aiter-mha"}
    core, mha = packages["jax-aiter-core"], packages["jax-aiter-mha"]
    for package in (core, mha):
        assert package.version == VERSION
        assert package.build_string.startswith("cpu_offline_py312h")
        assert package.subdir == "linux-64"
        # No channel packages in the offline variant, so none hands down run_exports; neither package declares
        # any (only the rocm variant's aiter-jit-libs does, checked where the variants are rendered).
        rattler.package_streaming.extract(package.path, tmp_path / package.name)
        assert (tmp_path / package.name / "info" / "index.json").is_file()
        assert not (tmp_path / package.name / "info" / "run_exports.json").exists()
    assert core.depends == []
    assert mha.depends == [f"jax-aiter-core =={VERSION} {core.build_string}"]


@pytest.mark.slow
def test_offline_packages_split_the_files(packages):
    core_files = [f for f in packages["jax-aiter-core"].files if not f.startswith("info/")]
    mha_files = [f for f in packages["jax-aiter-mha"].files if not f.startswith("info/")]
    assert f"{SITE}/jax_aiter/__init__.py" in core_files
    assert f"{SITE}/jax_aiter/lib/libjax_aiter_cpu.so" in core_files
    assert f"{SITE}/jax_aiter/mha/__init__.py" in mha_files
    assert [f for f in core_files if _is_mha(f)] == []
    assert [f for f in mha_files if not _is_mha(f)] == []


def _run_check(script: str, prefix: Path) -> dict:
    """Run recipe/tests/<script> with this test's Python and only the prefix's site-packages added to the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_AITER_LIB_DIR", "JAX_AITER_BACKEND")}
    env["PYTHONPATH"] = str(prefix / SITE)
    proc = subprocess.run([sys.executable, str(CHECKS / script), str(prefix)], cwd=prefix, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def _install(channel: Path, prefix: Path, cache: Path, specs: list[str], installed=None):
    records = await rattler.solve(sources=[rattler.Channel(str(channel))], specs=specs,
                                  platforms=["linux-64", "noarch"], locked_packages=installed,
                                  virtual_packages=rattler.VirtualPackage.detect())
    await rattler.install(records, target_prefix=prefix, cache_dir=cache, show_progress=False)
    return records


@pytest.mark.slow
def test_install_core_then_add_mha(offline_channel, tmp_path):
    prefix, cache = tmp_path / "env", tmp_path / "pkgs"
    core_only = asyncio.run(_install(offline_channel, prefix, cache, ["jax-aiter-core"]))
    assert [r.name.normalized for r in core_only] == ["jax-aiter-core"]
    found = _run_check("check_core.py", prefix)
    assert found["rms_norm"] == "native"
    assert Path(found["cpu_library"]) == prefix / SITE / "jax_aiter" / "lib" / "libjax_aiter_cpu.so"
    assert "jax-aiter-mha" in found["mha_error"]

    both = asyncio.run(_install(offline_channel, prefix, cache, ["jax-aiter-core", "jax-aiter-mha"], core_only))
    assert sorted(r.name.normalized for r in both) == ["jax-aiter-core", "jax-aiter-mha"]
    found = _run_check("check_mha.py", prefix)
    assert Path(found["jax_aiter.mha"]) == prefix / SITE / "jax_aiter" / "mha"
