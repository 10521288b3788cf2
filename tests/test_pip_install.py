"""pip: the build requirements, the wheel that scripts/plain.sh builds the way `pip install .` does (isolated build
environment, kept in build/wheelhouse and named by JA_WHEEL), the source distribution, and the demo task started
from the repository root.

Nothing here compiles the native libraries a second time: the wheel tests read plain.sh's wheel (and skip without
one), and the sdist test checks that the sdist holds every file the build reads and that CMake configures from it.
"""

from __future__ import annotations

import hashlib
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
        assert "Tag: py3-none-linux_x86_64" in zf.read(f"{dist_info}/WHEEL").decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert _requirement(requires, "jax").specifier == _requirement(PYPROJECT["project"]["dependencies"],
                                                                   "jax").specifier
    assert wheel.name.startswith(f"jax_aiter-{VERSION}-py3-none-linux_x86_64")


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


_NATIVE_CHECK = """
import json, sys
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
import jax_aiter
from jax_aiter import _backend, _native, rmsnorm
from jax_aiter.ref import rmsnorm as ref
x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
g = jnp.ones((128,), jnp.float32)
chosen = _backend.select("rms_norm", "cpu", (x, g), {"epsilon": 1e-6}).name
np.testing.assert_allclose(np.asarray(rmsnorm.rms_norm(x, g)), np.asarray(ref.rms_norm(x, g, epsilon=1e-6)),
                           rtol=1e-5, atol=1e-5)
print(json.dumps({"jax_aiter": jax_aiter.__file__, "chosen": chosen, "library": str(_native.load("cpu").path),
                  "jax": jax.__version__}))
"""


@pytest.mark.slow
def test_wheel_installs_into_a_bare_venv_and_runs_native(wheel, tmp_path):
    """The wheel and its requirements from the package index into a virtual environment that has nothing else."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # pip from this environment installs into the bare one (--python), so the bare one stays free of pip.
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_AITER_LIB_DIR", "JAX_AITER_BACKEND", "PYTHONPATH")}
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)],
                             capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stderr[-4000:]
    run = subprocess.run([str(python), "-c", _NATIVE_CHECK], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["chosen"] == "native"
    assert Path(found["library"]).is_relative_to(venv) and Path(found["jax_aiter"]).is_relative_to(venv)


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
def test_demo_from_the_repository_root_uses_the_installed_native_library():
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
    assert re.search(r"^\*\s+rms_norm\s+cpu\s+->\s+native\b", out, re.M), out[:3000]
    assert "loss: first steps" in out
