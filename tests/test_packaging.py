"""Packaging: the conda recipe (recipe/), its offline CI build, and the pixi workspace (docs/packaging.md).

The fast tests render the recipe's cpu, cuda and rocm variants for every Python (no build, no channel), solve a
channel made of the rendered variants' index records, and read pixi.toml (validated against pixi's manifest schema,
vendored in tests/fixtures/pixi). The slow ones build the offline cpu packages once with scripts/conda_build.py (the
recipe with the offline override of that script; the build also runs the recipe's own tests), inspect them, and
install them with py-rattler into a fresh prefix from the local output channel alone, where
recipe/tests/check_*.py run an op and attention from the installed files.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

# The conda tooling comes with the test extra (pyproject.toml); machines without it skip this file.
rattler = pytest.importorskip("rattler")
rattler_build = pytest.importorskip("rattler_build")
import rattler.package_streaming  # noqa: E402
from packaging.requirements import Requirement  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
RECIPE_TEXT = (ROOT / "recipe" / "recipe.yaml").read_text()
CHECKS = ROOT / "recipe" / "tests"
SITE_GLOB = "lib/python*/site-packages"
# Every Python that jaxlib 0.11.1 (the floor's jaxlib) has wheels for, and that jax 0.11.1 declares: CPython 3.12 to
# 3.15. Raising the jax floor means checking this list again.
FLOOR_PYTHONS = ("3.12", "3.13", "3.14", "3.15")

_spec = importlib.util.spec_from_file_location("conda_build", ROOT / "scripts" / "conda_build.py")
conda_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conda_build)


def _is_mha(path: str) -> bool:
    """The attention part of the project: jax_aiter/mha/, shared libraries named for MHA (and their build records),
    and the recipe test files that rattler-build stores in jax-aiter-mha."""
    name = path.rsplit("/", 1)[-1]
    return ("/jax_aiter/mha/" in path or path.startswith("etc/conda/test-files/jax-aiter-mha/")
            or (name.startswith("libjax_aiter_") and "mha" in name))


def _jax_floor() -> str:
    (pin,) = next(r for r in map(Requirement, PYPROJECT["build-system"]["requires"]) if r.name == "jax").specifier
    return pin.version


# --- rendering: every backend and Python, no build -----------------------------------------------------------


def _rendered(backend: str) -> list:
    return conda_build.render(backend)


def _by_python(variants) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for variant in variants:
        out.setdefault(variant.variant["python"], {})[variant.recipe.package.name] = variant
    return out


def _exact_pin(variant, name: str) -> bool:
    return {"pin_subpackage": {"name": name, "exact": True}} in variant.recipe.requirements.run


def _staging(variant):
    return variant.recipe.staging_caches[0]


# ids that are not bare backend names: conftest.py skips tests whose keywords include "rocm" on machines without one.
@pytest.mark.parametrize("backend", ["cpu", "cuda", "rocm"], ids=lambda backend: f"{backend}-variant")
def test_rendered_variant_outputs_and_requirements(backend):
    by_python = _by_python(_rendered(backend))
    assert sorted(by_python) == [f"{python}.*" for python in FLOOR_PYTHONS]
    floor = _jax_floor()
    for python, packages in by_python.items():
        tag = "py" + python.removesuffix(".*").replace(".", "")
        expected = {"jax-aiter-core", "jax-aiter-mha"} | ({"aiter-jit-libs"} if backend == "rocm" else set())
        assert set(packages) == expected
        for variant in packages.values():
            recipe = variant.recipe
            assert recipe.package.version == VERSION
            assert recipe.build.string.startswith(f"{backend}_{tag}h")
            # jaxlib's convention: CUDA builds 200 higher, so a machine with __cuda prefers them.
            assert recipe.build.number == (200 if backend == "cuda" else 0)
            assert recipe.build.string.endswith(f"_{recipe.build.number}")
            build = recipe.to_dict()["build"]
            # Files stay as their build records describe them: no RPATH rewriting, no prefix replacement.
            assert build["dynamic_linking"]["binary_relocation"] is False
            assert build["prefix_detection"]["ignore"] == [f"{SITE_GLOB}/jax_aiter/lib/**"]

        core, mha = packages["jax-aiter-core"], packages["jax-aiter-mha"]
        assert _exact_pin(mha, "jax-aiter-core")
        assert mha.variant["jax-aiter-core"] == f"{VERSION} {core.recipe.build.string}"
        # rocm outputs are down-prioritized, so a plain solve does not pick them.
        for variant in (core, mha):
            assert variant.recipe.to_dict()["build"]["variant"]["down_prioritize_variant"] == (
                1 if backend == "rocm" else 0)
        # core inherits the build environment's run exports (Python, C++ runtime); mha only needs the exact core.
        assert core.recipe.to_dict()["inherits_from"] == {"cache_name": "jax-aiter-build", "inherit_run_exports": True}
        assert mha.recipe.to_dict()["inherits_from"] == {"cache_name": "jax-aiter-build", "inherit_run_exports": False}
        assert mha.recipe.requirements.run == [{"pin_subpackage": {"name": "jax-aiter-core", "exact": True}}]

        run = [spec for spec in core.recipe.requirements.run if isinstance(spec, str)]
        assert "python" in run and f"jax >={floor}" in run
        # Every runtime dependency pyproject.toml declares is a conda requirement too, with the same floor.
        for dependency in map(Requirement, PYPROJECT["project"]["dependencies"]):
            specs = [spec for spec in run if spec.split()[0] == dependency.name]
            assert specs, f"{dependency.name} missing from jax-aiter-core's run requirements"
            assert all(spec.split()[1] == str(dependency.specifier) for spec in specs), (specs, dependency)

        staging = _staging(core).requirements
        assert {"cmake >=3.24", "ninja", "gxx_linux-64 14.*", "sysroot_linux-64 2.28.*"} <= set(staging.build)
        # The headers the libraries compile against are the floor's, as in pyproject.toml's build requirements.
        assert {"python", "pip", "scikit-build-core >=0.10", f"jax {floor}.*", f"jaxlib {floor}.*"} <= set(staging.host)
        # Static cudart: its run export is ignored (at the staging level, so for every output).
        assert _staging(core).to_dict()["requirements"]["ignore_run_exports"] == {"by_name": ["cuda-cudart"]}
        if backend == "cuda":
            assert "cuda-nvcc_linux-64 12.9.*" in staging.build
            assert {"cuda-version 12.9.*", "cuda-cudart-dev"} <= set(staging.host)
            assert {f"jaxlib >={floor} *cuda*", "__cuda"} <= set(run)
        else:
            assert not any("cuda" in spec for spec in staging.build + staging.host + run)
        if backend == "rocm":
            jit_libs = packages["aiter-jit-libs"]
            assert _exact_pin(core, "aiter-jit-libs")
            assert core.variant["aiter-jit-libs"] == f"{VERSION} {jit_libs.recipe.build.string}"
            run_exports = jit_libs.recipe.to_dict()["requirements"]["run_exports"]
            assert run_exports == {"weak": [{"pin_subpackage": {"name": "aiter-jit-libs", "exact": True}}]}
            assert {"pandas", "psutil", "packaging", "setuptools"} <= set(staging.host)


def _gitlink() -> str | None:
    if shutil.which("git") is None:
        return None
    line = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--stage", "--", "third_party/aiter"],
                          capture_output=True, text=True).stdout.split()
    return line[1] if line[:1] == ["160000"] else None


def test_sources_are_the_release_sdist_and_on_rocm_the_pinned_aiter():
    for backend in ("cpu", "cuda", "rocm"):
        sources = _staging(_rendered(backend)[0]).to_dict()["source"]
        sdist = sources[0]
        assert sdist["url"] == f"https://pypi.org/packages/source/j/jax-aiter/jax_aiter-{VERSION}.tar.gz"
        assert re.fullmatch(r"[0-9a-f]{64}", sdist["sha256"])
        if backend != "rocm":
            assert len(sources) == 1
            continue
        (aiter,) = sources[1:]
        from jax_aiter.aiter import manifest

        assert aiter == {"git": "https://github.com/ROCm/aiter.git", "rev": manifest.PINNED_AITER_COMMIT,
                         "target_directory": "third_party/aiter"}
        if _gitlink() is not None:
            assert aiter["rev"] == _gitlink()
    # Nothing for CI in the published recipe: no checkout path, no offline switch, no experimental-only function.
    for word in ("path:", "offline", "JA_BUILD_PYTHON", "load_from_file", "python_min", "build/aiter"):
        assert word not in RECIPE_TEXT, word


def test_about_licenses_and_urls():
    urls = PYPROJECT["project"]["urls"]
    for backend in ("cpu", "rocm"):
        for variant in _rendered(backend):
            about = variant.recipe.to_dict()["about"]
            assert about["license"] == "MIT"
            assert about["homepage"] == urls["Homepage"]
            files = about["license_file"]
            assert files[0] == "LICENSE"
            aiter_licenses = ["third_party/aiter/LICENSE", "third_party/aiter/3rdparty/composable_kernel/LICENSE"]
            # AITER's and Composable Kernel's licenses travel with what is built from them.
            name = variant.recipe.package.name
            ships_aiter = name == "aiter-jit-libs" or (name == "jax-aiter-mha" and backend == "rocm")
            assert files[1:] == (aiter_licenses if ships_aiter else [])
    assert (ROOT / "LICENSE").is_file() and "MIT License" in (ROOT / "LICENSE").read_text()


def test_recipe_pins_match_the_project():
    context = rattler_build.Stage0Recipe.from_file(ROOT / "recipe" / "recipe.yaml").context
    assert context["version"] == VERSION
    assert context["jax_floor"] == _jax_floor()
    variants = (ROOT / "recipe" / "variants.yaml").read_text()
    # The Python matrix starts where pyproject.toml's requires-python does.
    assert PYPROJECT["project"]["requires-python"] == f">={FLOOR_PYTHONS[0]}"
    assert re.findall(r'^  - "(3\.\d+)\.\*"$', variants, re.M) == list(FLOOR_PYTHONS)


def test_build_strings_differ_across_variants():
    strings = [v.recipe.build.string for backend in ("cpu", "cuda", "rocm") for v in _rendered(backend)]
    offline = [v.recipe.build.string for v in conda_build.render("cpu", offline=True)]
    assert all(s.startswith("offline_cpu_py") for s in offline)
    strings += offline
    assert len(strings) == len(set(strings)), strings


def test_offline_override_builds_from_the_checkout_without_channel_requirements():
    before = RECIPE_TEXT
    variants = conda_build.render("cpu", offline=True)
    assert (ROOT / "recipe" / "recipe.yaml").read_text() == before, "the override must not write recipe/"
    assert {v.recipe.package.name for v in variants} == {"jax-aiter-core", "jax-aiter-mha"}
    for variant in variants:
        staging = _staging(variant)
        assert staging.to_dict()["source"] == [{"path": str(ROOT)}]
        assert staging.requirements.build == [] and staging.requirements.host == []
        assert variant.variant["python"] == conda_build.this_python()
        assert not [test for test in variant.recipe.to_dict()["tests"] if "python" in test]
    mha = next(v for v in variants if v.recipe.package.name == "jax-aiter-mha")
    core = next(v for v in variants if v.recipe.package.name == "jax-aiter-core")
    assert mha.recipe.requirements.run == [{"pin_subpackage": {"name": "jax-aiter-core", "exact": True}}]
    assert core.recipe.requirements.run == []


# --- the staging build script ----------------------------------------------------------------------------


def _fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """A `python` that records its arguments and the variables build.sh exports, and succeeds."""
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(
        '#!/bin/sh\n{ for a in "$@"; do printf "arg=%s\\n" "$a"; done; '
        'printf "env=%s %s %s\\n" "$JA_ENABLE_CUDA" "$JA_ENABLE_HIP" "${CMAKE_PREFIX_PATH:-}"; echo end; } '
        f'>> "{log}"\n')
    (bin_dir / "python").chmod(0o755)
    return bin_dir, log


def _calls(log: Path) -> list[list[str]]:
    return [record.splitlines() for record in log.read_text().split("end\n")[:-1]]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("backend", ["cpu", "cuda", "rocm"], ids=lambda backend: f"{backend}-build-script")
def test_build_script(backend, tmp_path):
    """What recipe/build.sh runs per backend: on rocm AITER's build from the fetched source into the stage CMake
    reads (its defaults JA_AITER_DIR and JA_AITER_STAGE_DIR), then for every backend pip with the conda RUNPATH,
    then recipe/dist_info.py."""
    bin_dir, log = _fake_python(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "JA_GPU_BACKEND": backend,
           "JA_HIP_ARCHS": "gfx942;gfx950", "ROCM_PATH": "/opt/rocm", "PREFIX": str(tmp_path / "prefix"),
           "RECIPE_DIR": str(ROOT / "recipe"), "CPU_COUNT": "7"}
    result = subprocess.run(["bash", str(ROOT / "recipe" / "build.sh")], cwd=work, env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    calls = _calls(log)
    *stage, install, dist_info = calls
    args = [line.removeprefix("arg=") for line in install if line.startswith("arg=")]
    assert args[:3] == ["-m", "pip", "install"] and "--no-build-isolation" in args and "--no-deps" in args
    assert args[args.index("--prefix") + 1] == env["PREFIX"]
    assert "--config-settings=cmake.define.JA_INSTALL_RPATH=$ORIGIN/../../../.." in args
    assert f"--config-settings=cmake.define.JA_ENABLE_AITER={'ON' if backend == 'rocm' else 'OFF'}" in args
    cuda, hip = {"cpu": ("OFF", "OFF"), "cuda": ("ON", "OFF"), "rocm": ("OFF", "ON")}[backend]
    assert install[-1].startswith(f"env={cuda} {hip}")
    assert dist_info[:2] == [f"arg={ROOT / 'recipe' / 'dist_info.py'}", f"arg={env['PREFIX']}"]
    if backend != "rocm":
        assert stage == []
        return
    (stage,) = stage
    assert [line.removeprefix("arg=") for line in stage if line.startswith("arg=")] == [
        "tools/aiter_build.py", "stage", "--aiter", "third_party/aiter", "--stage", "build/aiter", "--jit-dir",
        "build/aiter-jit", "--archs", "gfx942;gfx950", "--jobs", "7"]
    assert stage[-1] == "env=OFF ON /opt/rocm"
    cmake = (ROOT / "csrc" / "aiter" / "CMakeLists.txt").read_text()
    assert '"${JA_REPO_ROOT}/third_party/aiter"' in cmake and '"${JA_REPO_ROOT}/build/aiter"' in cmake


def test_aiter_build_takes_a_checkout_without_git_as_the_pinned_commit(tmp_path, monkeypatch):
    """The sdist has no gitlink and rattler-build's copy of the git source need not keep git metadata: the build tool
    then uses the commit the runtime validates assets against, which the recipe fetched."""
    spec = importlib.util.spec_from_file_location("aiter_build", ROOT / "tools" / "aiter_build.py")
    aiter_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aiter_build)
    from jax_aiter.aiter import manifest

    monkeypatch.chdir(tmp_path)  # a source tree that is no git checkout
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert aiter_build.pinned_commit() == manifest.PINNED_AITER_COMMIT
    copy = tmp_path / "third_party" / "aiter"
    copy.mkdir(parents=True)
    assert aiter_build.aiter_commit(copy, manifest.PINNED_AITER_COMMIT) == manifest.PINNED_AITER_COMMIT


# --- solving: which build a machine gets ---------------------------------------------------------------------


def _next_minor(python: str) -> str:
    major, minor = python.split(".")
    return f"{major}.{int(minor) + 1}"


def _index_records() -> list[dict]:
    """The index.json fields rattler-build writes for every rendered package of the recipe: name, version, build
    string and number, run requirements with the exact pins resolved and, for outputs that inherit them, the run
    exports of the build environment's Python; and track_features, which rattler-build makes of
    down_prioritize_variant (one feature "<name>-p-<i>" per level)."""
    records = []
    for backend in ("cpu", "cuda", "rocm"):
        for variant in _rendered(backend):
            recipe = variant.recipe
            python = variant.variant["python"].removesuffix(".*")
            depends = []
            for spec in recipe.requirements.run:
                if isinstance(spec, str):
                    depends.append(spec)
                else:
                    name = spec["pin_subpackage"]["name"]
                    version, build = variant.variant[name].split()
                    depends.append(f"{name} =={version} {build}")
            if recipe.to_dict()["inherits_from"]["inherit_run_exports"]:
                depends += [f"python >={python},<{_next_minor(python)}.0a0",
                            f"python_abi {python}.* *_cp{python.replace('.', '')}"]
            levels = (recipe.to_dict()["build"].get("variant") or {}).get("down_prioritize_variant") or 0
            records.append({"name": recipe.package.name, "version": recipe.package.version,
                            "build": recipe.build.string, "build_number": recipe.build.number,
                            "depends": depends,
                            "track_features": " ".join(f"{recipe.package.name}-p-{i}" for i in range(abs(levels)))})
    return records


def _stand_ins() -> list[dict]:
    """What the packages depend on, as a channel offers it: one Python per matrix entry, and jax, jaxlib (a CPU
    build, and a CUDA build that needs __cuda and carries jaxlib's +200), numpy and ml_dtypes for each."""
    floor = _jax_floor()
    out = [{"name": "jax", "version": "0.12.0", "build": "pyhd8ed1ab_0", "build_number": 0,
            "depends": [f"jaxlib >={floor}", "python >=3.12"]}]
    for python in FLOOR_PYTHONS:
        tag = python.replace(".", "")
        pin = [f"python >={python},<{_next_minor(python)}.0a0", f"python_abi {python}.* *_cp{tag}"]
        out += [
            {"name": "python", "version": f"{python}.0", "build": "h0_cpython", "build_number": 0,
             "depends": [f"python_abi {python}.* *_cp{tag}"]},
            {"name": "python_abi", "version": python, "build": f"8_cp{tag}", "build_number": 8, "depends": []},
            {"name": "jaxlib", "version": "0.12.0", "build": f"cpu_py{tag}h0_0", "build_number": 0, "depends": pin},
            {"name": "jaxlib", "version": "0.12.0", "build": f"cuda129_py{tag}h0_200", "build_number": 200,
             "depends": pin + ["__cuda"]},
            {"name": "numpy", "version": "2.2.0", "build": f"py{tag}h0_0", "build_number": 0, "depends": pin},
            {"name": "ml_dtypes", "version": "0.5.0", "build": f"py{tag}h0_0", "build_number": 0, "depends": pin},
        ]
    return out


def _write_channel(channel: Path, track_features: bool = True) -> Path:
    packages = {}
    # Timestamps grow in rendering order (cpu, cuda, rocm), as when the variants are built one after the other: the
    # rocm records are the newest, which a solver prefers when nothing else tells the builds apart.
    for i, record in enumerate(_index_records() + _stand_ins()):
        record = {"subdir": "linux-64", "timestamp": 1_700_000_000_000 + 1000 * i, "size": 1, "md5": f"{i:032x}",
                  "sha256": f"{i:064x}", **record}
        if not (track_features and record.get("track_features")):
            record.pop("track_features", None)
        packages[f"{record['name']}-{record['version']}-{record['build']}.conda"] = record
    for subdir, content in (("linux-64", packages), ("noarch", {})):
        (channel / subdir).mkdir(parents=True)
        (channel / subdir / "repodata.json").write_text(json.dumps(
            {"info": {"subdir": subdir}, "packages": {}, "packages.conda": content}))
    return channel


@pytest.fixture(scope="module")
def rendered_channel(tmp_path_factory) -> Path:
    return _write_channel(tmp_path_factory.mktemp("rendered-channel"))


def _machine(cuda: bool) -> list:
    def virtual(name: str, version: str):
        return rattler.GenericVirtualPackage(rattler.PackageName(name), rattler.Version(version),
                                             rattler.BuildString("0"))
    packages = [virtual("__unix", "0"), virtual("__linux", "6.1"), virtual("__glibc", "2.35")]
    return packages + ([virtual("__cuda", "12.9")] if cuda else [])


def _solve(channel: Path, specs: list[str], cuda: bool = False) -> dict[str, str]:
    records = asyncio.run(rattler.solve(sources=[rattler.Channel(str(channel))], specs=specs,
                                        platforms=["linux-64", "noarch"], virtual_packages=_machine(cuda)))
    return {r.name.normalized: str(r.build) for r in records}


def test_a_cpu_machine_solves_to_the_cpu_build(rendered_channel, tmp_path):
    solved = _solve(rendered_channel, ["jax-aiter-core"])
    assert solved["jax-aiter-core"].startswith("cpu_"), solved
    assert solved["jaxlib"].startswith("cpu_") and "aiter-jit-libs" not in solved
    solved = _solve(rendered_channel, ["jax-aiter-mha"])
    assert solved["jax-aiter-mha"].startswith("cpu_") and solved["jax-aiter-core"].startswith("cpu_"), solved
    # The same channel without the track features that down_prioritize_variant makes gives the rocm build: the
    # down-prioritization is what keeps a CPU machine off it.
    unprioritized = _write_channel(tmp_path / "unprioritized", track_features=False)
    assert _solve(unprioritized, ["jax-aiter-core"])["jax-aiter-core"].startswith("rocm_")


def test_a_cuda_machine_solves_to_the_cuda_build_and_rocm_is_taken_only_when_asked(rendered_channel):
    solved = _solve(rendered_channel, ["jax-aiter-mha"], cuda=True)
    assert solved["jax-aiter-mha"].startswith("cuda_") and solved["jax-aiter-core"].startswith("cuda_"), solved
    solved = _solve(rendered_channel, ["jax-aiter-core * rocm_*"])
    assert solved["jax-aiter-core"].startswith("rocm_") and solved["aiter-jit-libs"].startswith("rocm_"), solved
    # The rocm records carry one track feature each.
    rocm = [r for r in _index_records() if r["build"].startswith("rocm_") and r["name"] != "aiter-jit-libs"]
    assert rocm and all(r["track_features"] == f"{r['name']}-p-0" for r in rocm)


# --- pixi workspace --------------------------------------------------------------------------------------


PIXI = tomllib.loads((ROOT / "pixi.toml").read_text())
PIXI_SCHEMA_DIR = ROOT / "tests" / "fixtures" / "pixi"


def test_pixi_manifest_matches_pixis_schema():
    jsonschema = pytest.importorskip("jsonschema")
    (schema_file,) = PIXI_SCHEMA_DIR.glob("manifest-schema-*.json")
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(PIXI), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    # The validator is live: a misspelled table is an error.
    assert list(validator.iter_errors({**PIXI, "dependancies": {}}))


def test_pixi_environments_and_tasks():
    assert PIXI["workspace"]["channels"] == ["conda-forge"]
    assert PIXI["workspace"]["platforms"] == ["linux-64"]
    assert set(PIXI["environments"]) == {"default", "cuda", "rocm"}
    for features in PIXI["environments"].values():
        features = features["features"] if isinstance(features, dict) else features
        assert set(features) <= set(PIXI["feature"])

    tasks = dict(PIXI["tasks"])
    for feature in PIXI["feature"].values():
        tasks.update(feature.get("tasks", {}))
    assert {"build", "test", "demo", "bench", "conda-build"} <= set(tasks)
    for name, task in tasks.items():
        task = {"cmd": task} if isinstance(task, str) else task
        words = shlex.split(task["cmd"])
        assert words == ["bash", "scripts/task.sh", name]
        for dependency in task.get("depends-on", []):
            assert dependency in tasks, f"pixi task {name!r} depends on unknown task {dependency!r}"


def _feature(name: str) -> dict:
    return PIXI["feature"][name]


def test_pixi_default_environment_is_hermetic():
    """The default environment builds the CPU library with its own compiler, whatever the machine has (nvcc on
    PATH, ROCm): every GPU switch of CMakeLists.txt is set, to OFF."""
    (feature,) = PIXI["environments"]["default"]
    env = _feature(feature)["activation"]["env"]
    assert env == {"JA_ENABLE_CUDA": "OFF", "JA_ENABLE_HIP": "OFF", "JA_ENABLE_AITER": "OFF"}
    assert {"cxx-compiler", "cmake", "ninja", "python"} <= set(PIXI["dependencies"])
    assert _feature("cuda")["activation"]["env"]["JA_ENABLE_CUDA"] == "ON"
    assert _feature("rocm")["activation"]["env"]["JA_ENABLE_HIP"] == "ON"


def _conda_to_pypi(name: str) -> str:
    return {"python-flatbuffers": "flatbuffers"}.get(name, name)


def _pixi_specs() -> dict[str, set[str]]:
    """Every version spec pixi.toml gives a package, over all tables and features (conda names as PyPI names)."""
    specs: dict[str, set[str]] = {}

    def add(table: dict) -> None:
        for name, spec in table.items():
            version = spec if isinstance(spec, str) else spec.get("version", "*")
            specs.setdefault(_conda_to_pypi(name), set()).add(version)

    for owner in [PIXI, *PIXI["feature"].values()]:
        add(owner.get("dependencies", {}))
        add(owner.get("pypi-dependencies", {}))
    return specs


def test_one_version_spec_per_tool():
    """A package named in pixi.toml and in pyproject.toml has one version spec in both (conda and PEP 440 spell the
    ones used here alike), except jax in the rocm environment, pinned to an existing plugin pair."""
    def normal(spec: str) -> SpecifierSet:
        return SpecifierSet("" if spec == "*" else spec)

    pixi = _pixi_specs()
    python: dict[str, set] = {}
    for requirement in (PYPROJECT["build-system"]["requires"] + PYPROJECT["project"]["dependencies"]
                        + [r for extra in PYPROJECT["project"]["optional-dependencies"].values() for r in extra]):
        requirement = Requirement(requirement)
        python.setdefault(requirement.name, set()).add(requirement.specifier)
    build_pin = SpecifierSet(f"=={_jax_floor()}")
    python["jax"].discard(build_pin)  # the build requirement: the floor itself
    pixi["jax"].discard(_feature("rocm")["pypi-dependencies"]["jax"]["version"])
    for name, specs in pixi.items():
        assert len(specs) == 1, (name, specs)
        if name in python:
            assert {normal(spec) for spec in specs} == python[name], (name, specs, python[name])
    assert python["cmake"] == {normal(PYPROJECT["tool"]["scikit-build"]["cmake"]["version"])}


def test_pixi_takes_jax_and_the_rattler_tools_from_pypi():
    """conda-forge lags PyPI for these (docs/packaging.md, "What the pixi environments rely on"): they are PyPI
    dependencies, never conda ones."""
    conda = set(PIXI.get("dependencies", {}))
    for feature in PIXI["feature"].values():
        conda |= set(feature.get("dependencies", {}))
    assert not conda & {"jax", "jaxlib", "py-rattler-build", "py-rattler"}
    assert {"py-rattler-build", "py-rattler", "flax"} <= set(PIXI["pypi-dependencies"])
    assert "flax" not in conda
    assert _feature("cpu")["pypi-dependencies"]["jax"] == f">={_jax_floor()}"
    assert _feature("cuda")["pypi-dependencies"]["jax"] == {"version": f">={_jax_floor()}", "extras": ["cuda12"]}


def test_pixi_rocm_environment_is_an_existing_plugin_pair():
    """jax 0.12.0.1's rocm7 extras ask for jax-rocm7-plugin 0.12.0.1, which PyPI does not have; 0.12.0 of jax, jaxlib,
    jax-rocm7-plugin and jax-rocm7-pjrt exist and belong together (jax 0.12.0's rocm7-local extra)."""
    pypi = _feature("rocm")["pypi-dependencies"]
    assert pypi["jax"] == {"version": "==0.12.0", "extras": ["rocm7-local"]}
    assert pypi["jax-rocm7-plugin"] == "==0.12.0" and pypi["jax-rocm7-pjrt"] == "==0.12.0"
    assert Version("0.12.0") >= Version(_jax_floor())


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
def packages(offline_channel) -> dict:
    return {p.name: p for p in map(rattler_build.Package.from_file,
                                   sorted((offline_channel / "linux-64").glob("*.conda")))}


@pytest.fixture(scope="module")
def extracted(packages, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, package in packages.items():
        out[name] = tmp_path_factory.mktemp(name)
        rattler.package_streaming.extract(package.path, out[name])
    return out


@pytest.mark.slow
def test_offline_packages_names_versions_and_pins(packages, extracted):
    assert set(packages) == {"jax-aiter-core", "jax-aiter-mha"}
    core, mha = packages["jax-aiter-core"], packages["jax-aiter-mha"]
    tag = conda_build.this_python().removesuffix(".*").replace(".", "")
    for package in (core, mha):
        assert package.version == VERSION
        assert package.build_string.startswith(f"offline_cpu_py{tag}h")
        assert package.subdir == "linux-64"
        # No channel packages in the offline build, so none hands down run_exports; neither package declares any.
        assert (extracted[package.name] / "info" / "index.json").is_file()
        assert not (extracted[package.name] / "info" / "run_exports.json").exists()
        assert (extracted[package.name] / "info" / "licenses" / "LICENSE").is_file()
    assert core.depends == []
    assert mha.depends == [f"jax-aiter-core =={VERSION} {core.build_string}"]


def _site(root: Path) -> Path:
    (site,) = root.glob(SITE_GLOB)
    return site


@pytest.mark.slow
def test_offline_packages_split_the_files_and_the_dist_info(packages, extracted):
    core_files = [f for f in packages["jax-aiter-core"].files if not f.startswith("info/")]
    mha_files = [f for f in packages["jax-aiter-mha"].files if not f.startswith("info/")]
    site = _site(extracted["jax-aiter-core"]).relative_to(extracted["jax-aiter-core"]).as_posix()
    assert f"{site}/jax_aiter/__init__.py" in core_files
    assert f"{site}/jax_aiter/lib/libjax_aiter_cpu.so" in core_files
    assert f"{site}/jax_aiter/lib/libjax_aiter_cpu.so.record" in core_files
    assert f"{site}/jax_aiter/mha/__init__.py" in mha_files
    assert [f for f in core_files if _is_mha(f)] == []
    assert [f for f in mha_files if not _is_mha(f)] == []
    # The dist-info travels with core and describes exactly core's files; it does not name the build directory.
    dist_info = f"{site}/jax_aiter-{VERSION}.dist-info"
    assert f"{dist_info}/direct_url.json" not in core_files
    assert not [f for f in mha_files if ".dist-info/" in f]
    record = (extracted["jax-aiter-core"] / dist_info / "RECORD").read_text()
    listed = {os.path.normpath(f"{site}/{row[0]}") for row in csv.reader(io.StringIO(record)) if row}
    packaged = {f for f in core_files if not f.startswith("etc/conda/test-files/")}
    assert listed == packaged, (sorted(listed - packaged), sorted(packaged - listed))


@pytest.mark.slow
def test_offline_libraries_are_installed_as_built(packages, extracted):
    """No RPATH rewriting and no prefix placeholder: rattler-build packs the libraries as CMake installed them."""
    core = extracted["jax-aiter-core"]
    paths = json.loads((core / "info" / "paths.json").read_text())["paths"]
    assert not [p["_path"] for p in paths if "/jax_aiter/lib/" in p["_path"] and p.get("prefix_placeholder")]
    library = _site(core) / "jax_aiter" / "lib" / "libjax_aiter_cpu.so"
    record = json.loads(library.with_name(library.name + ".record").read_text())
    assert record["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    readelf = shutil.which("readelf")
    if readelf:
        dynamic = subprocess.run([readelf, "-d", str(library)], capture_output=True, text=True).stdout
        assert "[$ORIGIN/../../../..]" in dynamic, dynamic


def _run_check(script: str, prefix: Path) -> dict:
    """Run recipe/tests/<script> with this test's Python; the script puts the prefix's site-packages first."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_AITER_LIB_DIR", "JAX_AITER_BACKEND", "PYTHONPATH")}
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


def _installed_libraries_match_their_records(prefix: Path) -> dict[str, str]:
    found = {}
    for library in sorted((_site(prefix) / "jax_aiter" / "lib").glob("*.so")):
        record = json.loads(library.with_name(library.name + ".record").read_text())
        data = library.read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, library
        found[library.name] = record["sha256"]
    return found


@pytest.mark.slow
def test_install_core_then_add_mha(offline_channel, tmp_path):
    prefix, cache = tmp_path / "env", tmp_path / "pkgs"
    core_only = asyncio.run(_install(offline_channel, prefix, cache, ["jax-aiter-core"]))
    assert [r.name.normalized for r in core_only] == ["jax-aiter-core"]
    # The installed libraries are byte for byte what CMake recorded when it installed them.
    assert "libjax_aiter_cpu.so" in _installed_libraries_match_their_records(prefix)
    found = _run_check("check_core.py", prefix)
    assert found["rms_norm"] == "native"
    assert Path(found["cpu_library"]) == _site(prefix) / "jax_aiter" / "lib" / "libjax_aiter_cpu.so"
    assert "jax-aiter-mha" in found["mha_error"]

    both = asyncio.run(_install(offline_channel, prefix, cache, ["jax-aiter-core", "jax-aiter-mha"], core_only))
    assert sorted(r.name.normalized for r in both) == ["jax-aiter-core", "jax-aiter-mha"]
    found = _run_check("check_mha.py", prefix)
    assert Path(found["jax_aiter.mha"]) == _site(prefix) / "jax_aiter" / "mha"
    _installed_libraries_match_their_records(prefix)
