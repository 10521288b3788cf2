"""Test tiers and hardware: `JA_TEST_TIER` selects the tests of one tier (TIERS; pytest's header says which ran);
`gpu` and `rocm` tests skip themselves without that hardware; the CPU is split into 8 virtual devices (set before
JAX initializes) so `multidevice` tests run anywhere (tests/_devices.py: on the GPUs where there are two or more).

Property tests are derandomized: hypothesis draws the same examples for a test on every run and machine (its
`deterministic` profile, the default here), so one commit passes or fails the same way each time. To search with
fresh random draws locally: `pytest --hypothesis-profile=randomized` (a failure it finds prints a reproduction
blob; add the example to the test)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import hypothesis  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

import _devices  # noqa: E402

hypothesis.settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
hypothesis.settings.register_profile("randomized", derandomize=False, database=None, print_blob=True)
hypothesis.settings.load_profile("deterministic")

jax.config.update("jax_enable_x64", False)

# JA_TEST_TIER: which tests one run selects (docs/reliability.md, "Test tiers"). Unset means nightly.
TIERS = {
    "pr": "every test but the slow ones and those that need a GPU (gpu, rocm): the quick tier",
    "nightly": "every test: slow ones included, gpu and rocm ones where that hardware is",
    "multigpu": "the multidevice tests, on the GPUs where there are two or more, else on 8 virtual CPU devices",
}
DEFAULT_TIER = "nightly"


def selected_tier() -> str:
    tier = os.environ.get("JA_TEST_TIER", "") or DEFAULT_TIER
    if tier not in TIERS:
        raise pytest.UsageError(f"JA_TEST_TIER={tier!r}: expected one of {', '.join(TIERS)}")
    return tier


def in_tier(tier: str, markers: set[str]) -> bool:
    """Whether a test with these markers belongs to the tier."""
    if tier == "pr":
        return not markers & {"slow", "gpu", "rocm"}
    if tier == "multigpu":
        return "multidevice" in markers
    return True


def pytest_configure(config):
    selected_tier()  # a misspelt tier fails before collection


def pytest_report_header(config):
    tier = selected_tier()
    devices = _devices.multidevice_devices()
    return [f"jax-aiter test tier: {tier} ({TIERS[tier]}); JA_TEST_TIER={os.environ.get('JA_TEST_TIER', '(unset)')}",
            f"multidevice tests run on {len(devices)} {devices[0].platform} devices"]


def _has(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    tier = selected_tier()
    selected, deselected = [], []
    for item in items:
        # Markers, not keywords: a parameter id such as "gpu" is a keyword too.
        (selected if in_tier(tier, {mark.name for mark in item.iter_markers()}) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    has_gpu = _has("cuda") or _has("rocm")
    has_rocm = _has("rocm")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA or ROCm GPU"))
        if "rocm" in item.keywords and not has_rocm:
            item.add_marker(pytest.mark.skip(reason="needs an AMD GPU (ROCm)"))


@pytest.fixture(autouse=True)
def cpu_unless_a_gpu_test(request):
    """A test outside the gpu and rocm markers computes on the CPU also on a machine whose default device is a GPU:
    its oracle bounds are the CPU reference's (on an H200, test_gemm_fp8's weight gradient differs from them by a
    bf16 unit, docs/fp8.md). GPU tests choose their device themselves (the `device` fixture); multidevice tests
    place their arrays on tests/_devices.py's devices."""
    if request.node.get_closest_marker("gpu") or request.node.get_closest_marker("rocm"):
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def automatic_selection():
    """No implementation forced while the test runs: for tests of the automatic selection itself, which CI also
    runs under the process-wide override JAX_AITER_BACKEND=xla (the suite's forced-reference path)."""
    from jax_aiter import _backend

    with _backend.overrides_in_force(()):
        yield


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
def host_cxx():
    """The host's C++ compiler (tests that build a fixture program skip without one)."""
    import shutil

    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a host C++ compiler")
    return cxx


@pytest.fixture(scope="session")
def host_driver(tmp_path_factory, host_cxx):
    """tests/fixtures/aiter/host_driver.cc with csrc/aiter's plain-C++ table parsing and kernel selection, built
    for this machine: it prints argument-block offsets and kernel choices as JSON."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    exe = tmp_path_factory.mktemp("aiter") / "host_driver"
    sources = [repo / "tests/fixtures/aiter/host_driver.cc", repo / "csrc/aiter/kernel_table.cc",
               repo / "csrc/aiter/gemm_select.cc"]
    subprocess.run([host_cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{repo / 'csrc/aiter'}",
                    *map(str, sources), "-o", str(exe)], check=True)
    return exe
