"""Test tiers: `gpu` and `rocm` tests skip themselves without that hardware; the CPU is split into 8 virtual
devices (set before JAX initializes) so `multidevice` tests run anywhere.

Property tests are derandomized: hypothesis draws the same examples for a test on every run and machine (its
`deterministic` profile, the default here), so one commit passes or fails the same way each time. To search with
fresh random draws locally: `pytest --hypothesis-profile=randomized` (a failure it finds prints a reproduction
blob; add the example to the test)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import hypothesis  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

hypothesis.settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
hypothesis.settings.register_profile("randomized", derandomize=False, database=None, print_blob=True)
hypothesis.settings.load_profile("deterministic")

jax.config.update("jax_enable_x64", False)


def _has(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    has_gpu = _has("cuda") or _has("rocm")
    has_rocm = _has("rocm")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA or ROCm GPU"))
        if "rocm" in item.keywords and not has_rocm:
            item.add_marker(pytest.mark.skip(reason="needs an AMD GPU (ROCm)"))


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    """The device a native-kernel test runs on; its platform's native library must have loaded (on a GPU that is
    a failure, on the CPU a skip)."""
    from jax_aiter import _native, native

    dev = jax.devices("cpu")[0] if request.param == "cpu" else jax.devices("gpu")[0]
    platform = "rocm" if "rocm" in dev.client.platform_version.lower() else dev.platform
    platform = "cuda" if platform == "gpu" else platform
    problem = _native.load(native.LIBRARY[platform]).problem
    if problem is not None:
        if request.param == "cpu":
            pytest.skip(problem)
        pytest.fail(problem)
    return dev


@pytest.fixture(scope="session")
def host_driver(tmp_path_factory):
    """tests/fixtures/aiter/host_driver.cc with csrc/aiter's plain-C++ table parsing and kernel selection, built
    for this machine: it prints argument-block offsets and kernel choices as JSON."""
    import shutil
    import subprocess
    from pathlib import Path

    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a host C++ compiler")
    repo = Path(__file__).resolve().parents[1]
    exe = tmp_path_factory.mktemp("aiter") / "host_driver"
    sources = [repo / "tests/fixtures/aiter/host_driver.cc", repo / "csrc/aiter/kernel_table.cc",
               repo / "csrc/aiter/gemm_select.cc"]
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{repo / 'csrc/aiter'}",
                    *map(str, sources), "-o", str(exe)], check=True)
    return exe
