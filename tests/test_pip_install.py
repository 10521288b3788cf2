"""pip: the build requirements, the wheel that scripts/plain.sh builds the way `pip install .` does (isolated build
environment, kept in build/wheelhouse and named by JA_WHEEL), the source distribution, and the demo task started
from the repository root.

Nothing here compiles the native libraries a second time: the wheel tests read plain.sh's wheel (and skip without
one), and the sdist test checks that the sdist holds every file the build reads and that CMake configures from it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.resources
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
SOURCE_PACKAGE = ROOT / "jax_aiter"  # the source tree's package, which has no native libraries
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
LIB = "jax_aiter/lib"
_spec = importlib.util.spec_from_file_location("wheels", ROOT / "scripts" / "wheels.py")
wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheels)


def _requirement(requirements: list[str], name: str) -> Requirement:
    return next(r for r in map(Requirement, requirements) if r.name == name)


def test_build_requirements_pin_jax_at_the_runtime_floor():
    """The libraries are compiled against the FFI headers of the build environment's jaxlib, and XLA loads handlers
    built against its own or an older FFI API: building with the oldest accepted jax makes them load everywhere."""
    built_with = _requirement(PYPROJECT["build-system"]["requires"], "jax")
    runs_with = _requirement(PYPROJECT["project"]["dependencies"], "jax")
    (pin,) = built_with.specifier
    (floor,) = runs_with.specifier
    assert pin.operator == "==" and floor.operator == ">="
    assert Version(pin.version) == Version(floor.version)


def test_wheel_settings():
    settings = PYPROJECT["tool"]["scikit-build"]
    # ctypes loads the libraries; none links libpython, so one wheel serves every Python.
    assert settings["wheel"]["py-api"] == "py3"
    assert (ROOT / "LICENSE").is_file()
    readme = (ROOT / "README.md").read_text()
    assert "pip install ." in readme


# --- the wheel plain.sh built ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel() -> Path:
    named = os.environ.get("JA_WHEEL")
    if named:
        assert Path(named).is_file(), f"JA_WHEEL={named} does not exist"
        return Path(named)
    found = sorted((ROOT / "build" / "wheelhouse").glob("jax_aiter-*.whl"))
    if not found:
        pytest.skip("no wheel in build/wheelhouse (scripts/plain.sh builds it)")
    return found[-1]


def _cuda_was_built() -> bool | None:
    """Whether the CMake build behind the wheel found nvcc (None when its cache is not here)."""
    caches = sorted((ROOT / "build").glob("py3-none-*/CMakeCache.txt"))
    if not caches:
        return None
    cache = caches[-1].read_text()
    enable = re.search(r"^JA_ENABLE_CUDA:\w+=(.*)$", cache, re.M)
    compiler = re.search(r"^CMAKE_CUDA_COMPILER:\w+=(.*)$", cache, re.M)
    if enable and enable.group(1).upper() in ("OFF", "0", "FALSE", "NO"):
        return False
    return bool(compiler and compiler.group(1) and not compiler.group(1).endswith("NOTFOUND"))


def test_wheel_carries_the_native_libraries_and_their_records(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        libraries = sorted(n for n in names if n.startswith(f"{LIB}/") and n.endswith(".so"))
        assert f"{LIB}/libjax_aiter_cpu.so" in libraries
        cuda = _cuda_was_built()
        if cuda is not None:
            assert (f"{LIB}/libjax_aiter_cuda.so" in libraries) == cuda, (libraries, cuda)
        for library in libraries:
            record = json.loads(zf.read(f"{library}.record"))
            data = zf.read(library)
            assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, library
        assert sorted(n.removesuffix(".record") for n in names if n.endswith(".record")) == libraries
        dist_info = f"jax_aiter-{VERSION}.dist-info"
        assert all(n.startswith(("jax_aiter/", f"{dist_info}/")) for n in names), names
        assert not [n for n in names if "__pycache__" in n]
        assert f"{dist_info}/licenses/LICENSE" in names
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        tags = [line.split(": ", 1)[1] for line in zf.read(f"{dist_info}/WHEEL").decode().splitlines()
                if line.startswith("Tag: ")]
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert _requirement(requires, "jax").specifier == _requirement(PYPROJECT["project"]["dependencies"],
                                                                   "jax").specifier
    # One wheel for every Python (py3-none), under the manylinux tags its file name carries (scripts/wheels.py).
    platforms = _platform_tags(wheel)
    assert tags == [f"py3-none-{platform}" for platform in platforms], tags
    assert wheel.name == f"jax_aiter-{VERSION}-py3-none-{'.'.join(platforms)}.whl"


def _platform_tags(wheel: Path) -> list[str]:
    platforms = wheel.name.removesuffix(".whl").split("-")[-1].split(".")
    assert all(re.fullmatch(r"manylinux_2_\d+_x86_64", p) for p in platforms), f"{wheel.name}: not manylinux"
    return platforms


# --- the manylinux tag against the libraries' symbol versions ----------------------------------------------


def _elf_needs(data: bytes) -> tuple[set[str], set[str]]:
    """The libraries an ELF file links (DT_NEEDED) and the symbol versions it needs from them (.gnu.version_r)."""
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(data))
    needed = {tag.needed for tag in elf.get_section_by_name(".dynamic").iter_tags() if tag.entry.d_tag == "DT_NEEDED"}
    section = elf.get_section_by_name(".gnu.version_r")
    versions = {aux.name for _, auxes in section.iter_versions() for aux in auxes} if section else set()
    return needed, versions


def _version(name: str) -> tuple[str, tuple[int, ...]]:
    """'GLIBCXX_3.4.29' -> ('GLIBCXX', (3, 4, 29))."""
    family, _, number = name.partition("_")
    return family, tuple(int(part) for part in number.split("."))


def _manylinux_policies() -> list[dict]:
    """auditwheel's manylinux policies, most compatible first: each names the symbol versions and libraries that
    every system of its tag provides."""
    text = importlib.resources.files("auditwheel.policy").joinpath("manylinux-policy.json").read_text()
    return sorted((p for p in json.loads(text) if p["name"].startswith("manylinux_")), key=lambda p: -p["priority"])


# glibc's dynamic loader, part of glibc on every system (its symbol versions are GLIBC_ ones, checked as such).
DYNAMIC_LOADER = "ld-linux-x86-64.so.2"


def _allows(policy: dict, needed: set[str], versions: set[str]) -> bool:
    provided = policy["symbol_versions"]["x86_64"]
    return needed - {DYNAMIC_LOADER} <= set(policy["lib_whitelist"]) and all(
        number in provided.get(family, ()) for family, _, number in (v.partition("_") for v in versions))


def test_wheel_platform_tag_is_the_floor_of_the_libraries_symbol_versions(wheel):
    """The tag promises that a system with glibc 2.N and that policy's libstdc++ runs the wheel: the libraries
    may need no newer symbol version (PEP 600). Measured here from the libraries' ELF version needs; the most
    compatible tag that satisfies them is the one the wheel must carry, as `auditwheel show` also says."""
    pytest.importorskip("elftools", reason="needs pyelftools (auditwheel brings it: the test extra)")
    pytest.importorskip("auditwheel", reason="needs auditwheel (the test extra)")
    needed, versions = set(), set()
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith(f"{LIB}/") and name.endswith(".so"):
                library_needed, library_versions = _elf_needs(zf.read(name))
                needed |= library_needed
                versions |= library_versions
    glibc = max(number for family, number in map(_version, versions) if family == "GLIBC")
    platforms = _platform_tags(wheel)
    for platform in platforms:
        major, minor = map(int, re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform).groups())
        assert (major, minor) >= glibc[:2], f"{platform}: the libraries need GLIBC_{'.'.join(map(str, glibc))}"
    policies = _manylinux_policies()
    by_name = {p["name"]: p for p in policies}
    for platform in platforms:
        assert _allows(by_name[platform.removesuffix("_x86_64")], needed, versions), (platform, sorted(versions))
    best = next(p["name"] for p in policies if _allows(p, needed, versions))
    assert min(platforms, key=lambda p: -by_name[p.removesuffix("_x86_64")]["priority"]) == f"{best}_x86_64"

    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True)
    assert show.returncode == 0, show.stderr[-3000:]
    assert re.search(rf'consistent with\s+the following platform tag:\s+"{best}_x86_64"', show.stdout), show.stdout


def test_the_suite_runs_the_installed_wheel(wheel):
    if "JA_WHEEL" not in os.environ:
        pytest.skip("only under scripts/plain.sh, which installs the wheel it names in JA_WHEEL")
    import jax_aiter
    from jax_aiter import _native

    package = Path(jax_aiter.__file__).resolve().parent
    assert package != SOURCE_PACKAGE, "jax_aiter imported from the source tree"
    library = _native.load("cpu")
    assert library.problem is None, library.problem
    assert library.path.parent == package / "lib", library.path
    with zipfile.ZipFile(wheel) as zf:
        assert library.path.read_bytes() == zf.read(f"{LIB}/libjax_aiter_cpu.so")


# --- the lite wheel (jax-aiter-core) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lite_wheel(wheel, tmp_path_factory) -> Path:
    """The lite wheel scripts/wheels.py made next to the full one (scripts/plain.sh), else made here from it."""
    beside = wheel.with_name(wheel.name.replace("jax_aiter-", "jax_aiter_core-", 1))
    if beside.is_file():
        return beside
    return wheels.lite_wheel(wheel, tmp_path_factory.mktemp("lite"))


def _record_problems(zf: zipfile.ZipFile, dist_info: str) -> list[str]:
    """What is wrong with a wheel's RECORD: a file missing from it, or listed with another hash or size."""
    rows = {row[0]: row[1:] for row in csv.reader(io.StringIO(zf.read(f"{dist_info}/RECORD").decode())) if row}
    problems = []
    for info in zf.infolist():
        if info.is_dir() or info.filename == f"{dist_info}/RECORD":
            continue
        data = zf.read(info)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if rows.pop(info.filename, None) != [f"sha256={digest}", str(len(data))]:
            problems.append(info.filename)
    return problems + [name for name in rows if name != f"{dist_info}/RECORD"]


def test_lite_wheel_is_the_full_wheel_without_attention(wheel, lite_wheel):
    full_info, lite_info = f"jax_aiter-{VERSION}.dist-info", f"jax_aiter_core-{VERSION}.dist-info"
    assert lite_wheel.name == wheel.name.replace("jax_aiter-", "jax_aiter_core-", 1)
    with zipfile.ZipFile(wheel) as full, zipfile.ZipFile(lite_wheel) as lite:
        full_files = {i.filename: full.read(i) for i in full.infolist() if not i.is_dir()}
        lite_files = {i.filename: lite.read(i) for i in lite.infolist() if not i.is_dir()}
        assert _record_problems(lite, lite_info) == []
    attention = {"jax_aiter/mha/__init__.py", "jax_aiter/mha/attention.py"}
    assert attention <= full_files.keys() and not attention & lite_files.keys()
    # Every package file but the attention ones, byte for byte: the libraries keep their build records.
    package = {n: d for n, d in full_files.items() if not n.startswith(full_info)}
    kept = {n: d for n, d in package.items() if not n.startswith("jax_aiter/mha/")
            and not re.fullmatch(r"jax_aiter/lib/(libjax_aiter_\w*mha\w*|aiter/libmha_\w+)\.so(\.record)?", n)}
    assert {n: d for n, d in lite_files.items() if not n.startswith(lite_info)} == kept
    assert f"{LIB}/libjax_aiter_cpu.so" in kept
    # The dist-info names jax-aiter-core; the rest of it (requirements, command, tag, license) is the full wheel's.
    assert sorted(n.removeprefix(lite_info) for n in lite_files if n.startswith(lite_info)) == \
        sorted(n.removeprefix(full_info) for n in full_files if n.startswith(full_info))
    full_metadata, lite_metadata = (files[f"{info}/METADATA"].decode().splitlines()
                                    for files, info in ((full_files, full_info), (lite_files, lite_info)))
    assert "Name: jax-aiter-core" in lite_metadata and "Name: jax-aiter" in full_metadata
    assert [line for line in lite_metadata if not line.startswith(("Name:", "Summary:"))] == \
        [line for line in full_metadata if not line.startswith(("Name:", "Summary:"))]
    for name in ("WHEEL", "entry_points.txt", "licenses/LICENSE"):
        assert lite_files[f"{lite_info}/{name}"] == full_files[f"{full_info}/{name}"], name


def test_lite_wheel_leaves_out_what_the_conda_package_jax_aiter_mha_ships():
    yaml = pytest.importorskip("yaml")
    recipe = yaml.safe_load((ROOT / "recipe" / "recipe.yaml").read_text())
    (mha,) = [o for o in recipe["outputs"] if o.get("package", {}).get("name") == "jax-aiter-mha"]
    prefix = "lib/python*/site-packages/"
    assert all(glob.startswith(prefix) for glob in mha["build"]["files"])
    conda_globs = [glob.removeprefix(prefix).replace("**", "*") for glob in mha["build"]["files"]]
    assert conda_globs == list(wheels.ATTENTION_FILES)


def test_missing_attention_names_the_package_that_adds_it(tmp_path, monkeypatch):
    """With the lite wheel's dist-info on the path, the full wheel; else (conda's jax-aiter-core) jax-aiter-mha."""
    from jax_aiter import _optional

    finder = next(f for f in sys.meta_path if type(f).__name__ == "_SeparatePackageFinder")
    assert finder.find_spec("jax_aiter.other") is None
    with pytest.raises(ModuleNotFoundError, match=r"'jax-aiter-mha'.*conda install jax-aiter-mha") as conda:
        finder.find_spec("jax_aiter.mha")
    assert conda.value.name == "jax_aiter.mha"
    dist_info = tmp_path / "jax_aiter_core-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax-aiter-core\nVersion: 0.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = _optional.missing_module_message("jax_aiter.mha")
    assert "'jax-aiter'" in message and "pip uninstall jax-aiter-core, then pip install jax-aiter" in message
    assert "jax-aiter-mha" not in message


_NATIVE_CHECK = """
import json, sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
import jax_aiter
from jax_aiter import _backend, _native, rmsnorm
from jax_aiter.ref import rmsnorm as ref
x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
g = jnp.ones((128,), jnp.float32)
assert _native.load("cpu").problem is None, _native.load("cpu").problem
with jax_aiter.use_backend(rms_norm="native"):
    chosen = _backend.select("rms_norm", "cpu", (x, g), {"epsilon": 1e-6}).name
    y = rmsnorm.rms_norm(x, g)
np.testing.assert_allclose(np.asarray(y), np.asarray(ref.rms_norm(x, g, epsilon=1e-6)), rtol=1e-5, atol=1e-5)
print(json.dumps({"jax_aiter": jax_aiter.__file__, "chosen": chosen, "library": str(_native.load("cpu").path),
                  "jax": jax.__version__}))
"""


# `jax-aiter info`'s line for rms_norm on the CPU when the library loaded: XLA's code, with the measurement as the
# reason the native kernel is not the default (a library that did not load would be the reason instead).
_CPU_DEFAULT_MEASURED = re.compile(r"^\*\s+rms_norm\s+cpu\s+->\s+xla\s+\(native: XLA's CPU code measured faster", re.M)


# The bare environment's own variables: none of this process's jax-aiter settings.
_BARE_ENV = {k: v for k, v in os.environ.items() if k not in ("JAX_AITER_LIB_DIR", "JAX_AITER_BACKEND", "PYTHONPATH")}


def _bare_venv_with(wheel: Path, tmp_path: Path) -> Path:
    """A virtual environment that has nothing but `wheel` and its requirements from the package index."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # pip from this environment installs into the bare one (--python), so the bare one stays free of pip.
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                              str(wheel)], capture_output=True, text=True, env=_BARE_ENV)
    assert install.returncode == 0, install.stderr[-4000:]
    return venv


def _run_json(venv: Path, *args: str) -> dict:
    """Runs the venv's Python with `args` outside the source tree; its last line of output, as JSON."""
    run = subprocess.run([str(venv / "bin" / "python"), *args], cwd=venv.parent, capture_output=True, text=True,
                         env=_BARE_ENV)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_wheel_installs_into_a_bare_venv_and_runs_native(wheel, tmp_path):
    venv = _bare_venv_with(wheel, tmp_path)
    found = _run_json(venv, "-c", _NATIVE_CHECK)
    assert found["chosen"] == "native"
    assert Path(found["library"]).is_relative_to(venv) and Path(found["jax_aiter"]).is_relative_to(venv)
    # Attention from the installed jax_aiter.mha equals softmax attention computed in NumPy.
    found = _run_json(venv, str(ROOT / "recipe" / "tests" / "check_mha.py"), str(venv))
    assert Path(found["jax_aiter.mha"]).is_relative_to(venv)


@pytest.mark.slow
def test_lite_wheel_installs_into_a_bare_venv_runs_native_and_names_the_full_wheel(lite_wheel, tmp_path):
    """The conda package jax-aiter-core's check (records, native rms_norm), with the full wheel jax-aiter as the
    package that adds attention."""
    venv = _bare_venv_with(lite_wheel, tmp_path)
    found = _run_json(venv, str(ROOT / "recipe" / "tests" / "check_core.py"), str(venv), "jax-aiter")
    assert found["rms_norm"] == "native" and Path(found["jax_aiter"]).is_relative_to(venv)
    assert "pip install jax-aiter" in found["mha_error"]
    # The command runs without attention: its table lists the ops that are there.
    info = subprocess.run([str(venv / "bin" / "jax-aiter"), "info"], cwd=tmp_path, capture_output=True, text=True,
                          env=_BARE_ENV)
    assert info.returncode == 0, info.stderr[-3000:]
    assert f"library cpu: {venv}" in info.stdout and _CPU_DEFAULT_MEASURED.search(info.stdout), info.stdout[:3000]
    assert "flash_attn" not in info.stdout


# --- the source distribution -------------------------------------------------------------------------------


def _tracked(*paths: str) -> list[str]:
    result = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", *paths], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip("needs a git checkout")
    return [line for line in result.stdout.splitlines() if (ROOT / line).is_file()]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_sdist_holds_what_the_build_reads_and_cmake_configures_from_it(tmp_path):
    pytest.importorskip("scikit_build_core")
    made = subprocess.run([sys.executable, "-c", "import sys; from scikit_build_core.build import build_sdist; "
                           "print(build_sdist(sys.argv[1]))", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-4000:]
    sdist = tmp_path / made.stdout.strip().splitlines()[-1]
    assert sdist.name == f"jax_aiter-{VERSION}.tar.gz"
    top = f"jax_aiter-{VERSION}"
    with tarfile.open(sdist) as tar:
        names = {name.removeprefix(f"{top}/") for name in tar.getnames()}
        tar.extractall(tmp_path, filter="data")
    needed = _tracked("CMakeLists.txt", "cmake", "csrc", "jax_aiter", "pyproject.toml", "README.md", "LICENSE",
                      "tools/aiter_build.py")
    assert [path for path in needed if path not in names] == []
    assert not [n for n in names if n.startswith((".ci/", "recipe/", "build/", ".venv/"))]

    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if cmake is None or ninja is None:
        pytest.skip("needs cmake and ninja")
    configure = subprocess.run([cmake, "-S", str(tmp_path / top), "-B", str(tmp_path / "build"), "-G", "Ninja",
                                "-DJA_ENABLE_CUDA=OFF", f"-DPython_EXECUTABLE={sys.executable}"],
                               capture_output=True, text=True)
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]


# --- the demo task from the repository root ----------------------------------------------------------------


def _installed_outside_the_tree() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax_aiter; print(jax_aiter.__file__)"], cwd="/",
                           capture_output=True, text=True)
    return probe.returncode == 0 and Path(probe.stdout.strip()).resolve().parent != SOURCE_PACKAGE


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_demo_from_the_repository_root_loads_the_installed_native_library():
    if not _installed_outside_the_tree():
        pytest.skip("jax-aiter is not installed for this interpreter (scripts/plain.sh demo installs it)")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_AITER_LIB_DIR", "JAX_AITER_BACKEND", "PYTHONPATH")}
    env["PYTHON"] = sys.executable
    result = subprocess.run(["bash", "scripts/task.sh", "demo", "--steps", "60"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    library = re.search(r"library cpu: (\S+\.so)", out)
    assert library, out[:3000]
    path = Path(library.group(1)).resolve()
    installed = subprocess.run([sys.executable, "-c", "import jax_aiter; print(jax_aiter.__file__)"], cwd="/",
                               env=env, capture_output=True, text=True).stdout.strip()
    assert path == Path(installed).resolve().parent / "lib" / "libjax_aiter_cpu.so", (path, installed)
    assert _CPU_DEFAULT_MEASURED.search(out), out[:3000]
    assert "loss: first steps" in out
