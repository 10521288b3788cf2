import dataclasses
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
import jax_aiter.gemm  # noqa: F401  (declares the gemm op some tests select for)
from jax_aiter import _backend, _native
from jax_aiter.rmsnorm import rms_norm

# These tests are about the automatic selection: none sees the process-wide override CI runs the suite under
# (JAX_AITER_BACKEND=xla), in this process or in the fresh interpreters below.
pytestmark = pytest.mark.usefixtures("automatic_selection")

X = jax.ShapeDtypeStruct((8, 64), jnp.bfloat16)
G = jax.ShapeDtypeStruct((64,), jnp.bfloat16)


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (import-time behaviour), with extra environment variables."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**{k: v for k, v in os.environ.items() if k != _backend.ENV_VAR}, **env}, timeout=300)


def test_preference_order_and_fallback_per_platform(monkeypatch):
    native_ok = _native.load("cpu").problem is None
    # rms_norm's CPU kernel is the default where nothing measured it slower (its CPU exception taken away here).
    spec = _backend._OPS["rms_norm"]
    unmeasured = tuple(dataclasses.replace(i, forced_only_on={}) for i in spec.implementations)
    monkeypatch.setitem(_backend._OPS, "rms_norm", dataclasses.replace(spec, implementations=unmeasured))
    assert _backend.select("rms_norm", "cpu", (X, G), {"epsilon": 1e-6}).name == ("native" if native_ok else "xla")
    # No ROCm build here: rocm falls back to the reference, whatever the CPU has.
    if _native.load("hip").problem:
        assert _backend.select("rms_norm", "rocm", (X, G), {"epsilon": 1e-6}).name == "xla"
    # A call the native kernel does not support (float32 gamma, bf16 x) takes the next implementation.
    g32 = jax.ShapeDtypeStruct((64,), jnp.float32)
    assert _backend.select("rms_norm", "cpu", (X, g32), {"epsilon": 1e-6}).name == "xla"


def test_an_implementation_forced_only_on_a_platform_runs_there_only_when_forced():
    """silu_and_mul's, rms_norm's and the casts' C++ kernels measured slower than XLA's CPU code: the CPU default
    is XLA, forcing runs them, and the report names the measurement. Other platforms are unaffected."""
    import jax_aiter.activation  # noqa: F401
    import jax_aiter.gemm_fp4  # noqa: F401

    if _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    x = jax.ShapeDtypeStruct((8, 64), jnp.bfloat16)
    assert _backend.select("silu_and_mul", "cpu", (x,), {}).name == "xla"
    with jax_aiter.use_backend(silu_and_mul="native"):
        assert _backend.select("silu_and_mul", "cpu", (x,), {}).name == "native"
        text = jax.jit(jax_aiter.activation.silu_and_mul).trace(x).lower(lowering_platforms=("cpu",)).as_text()
    assert "ja_silu_and_mul" in text
    assert "ja_silu_and_mul" not in jax.jit(jax_aiter.activation.silu_and_mul).trace(x).lower(
        lowering_platforms=("cpu",)).as_text()
    (choice,) = [c for c in _backend.report(("cpu",)) if c.op == "silu_and_mul"]
    assert choice.selected == "xla"
    assert dict(choice.rejected)["native"].startswith("XLA's CPU code measured faster")
    if _native.load("cuda").problem is None:
        assert _backend.select("silu_and_mul", "cuda", (x,), {}).name == "native"
    # The norms and the MXFP4 casts likewise.
    for op in ("rms_norm", "rms_norm_with_add"):
        args = (X, G) if op == "rms_norm" else (X, X, G)
        assert _backend.select(op, "cpu", args, {"epsilon": 1e-6}).name == "xla"
        with jax_aiter.use_backend(**{op: "native"}):
            assert _backend.select(op, "cpu", args, {"epsilon": 1e-6}).name == "native"
    assert _backend.select("cast_mxfp4", "cpu", (x,), {}).name == "xla"
    with jax_aiter.use_backend(cast_mxfp4="native"):
        assert _backend.select("cast_mxfp4", "cpu", (x,), {}).name == "native"


def test_use_backend_nests_and_restores():
    assert _backend.forced_implementation("gemm") is None
    with jax_aiter.use_backend("xla"):
        assert _backend.forced_implementation("rms_norm") == "xla"
        with jax_aiter.use_backend(rms_norm="native"):
            assert _backend.forced_implementation("rms_norm") == "native"
            assert _backend.forced_implementation("gemm") == "xla"
        assert _backend.forced_implementation("rms_norm") == "xla"
    assert _backend.forced_implementation("rms_norm") is None


def test_use_backend_is_part_of_the_jit_cache_key():
    if _native.load("cpu").problem:
        pytest.skip("native CPU library not built")
    f = jax.jit(rms_norm)
    x, g = jnp.ones((4, 16)), jnp.ones(16)
    with jax_aiter.use_backend("native"):
        native_text = f.trace(x, g).lower(lowering_platforms=("cpu",)).as_text()
    with jax_aiter.use_backend("xla"):
        xla_text = f.trace(x, g).lower(lowering_platforms=("cpu",)).as_text()
    assert "ja_rms_norm_fwd" in native_text and "ja_rms_norm_fwd" not in xla_text


def test_use_backend_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown implementation 'fast'"):
        with jax_aiter.use_backend("fast"):
            pass
    with pytest.raises(ValueError, match="unknown op 'conv'"):
        with jax_aiter.use_backend(conv="xla"):
            pass


def test_forcing_an_implementation_the_op_lacks_raises():
    with jax_aiter.use_backend(gemm="native"):
        with pytest.raises(ValueError, match="gemm: implementation 'native' is forced"):
            _backend.select("gemm", "cpu", (X, X), {})


def test_forcing_an_unsupported_call_raises():
    if _native.load("cpu").problem:
        pytest.skip("native CPU library not built")
    with jax_aiter.use_backend(rms_norm="native"):
        with pytest.raises(ValueError, match="cannot run this call on cpu: gamma dtype"):
            rms_norm(jnp.ones((2, 8), jnp.bfloat16), jnp.ones(8, jnp.float32))


def test_forced_implementation_is_emitted_for_a_platform_this_machine_lacks():
    # Cross-lowering: a CPU machine can lower the native kernels for ROCm although libjax_aiter_hip.so is absent.
    if _native.load("hip").problem is None:
        pytest.skip("a HIP build is present")
    if _native.load("cpu").problem:
        pytest.skip("forcing native also needs it on this machine's own platform (cpu)")
    with jax_aiter.use_backend(rms_norm="native"):
        text = jax.jit(rms_norm).trace(jnp.ones((4, 16)), jnp.ones(16)).lower(
            lowering_platforms=("rocm",)).as_text()
    assert "ja_rms_norm_fwd" in text


def test_environment_variable_sets_the_default():
    result = _run_python("""
        from jax_aiter import _backend
        import jax_aiter.rmsnorm
        print(_backend.forced_implementation("rms_norm"), _backend.forced_implementation("gemm"))
    """, JAX_AITER_BACKEND="native,gemm=xla")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["native", "xla"]
    bad = _run_python("import jax_aiter", JAX_AITER_BACKEND="turbo")
    assert bad.returncode != 0 and "JAX_AITER_BACKEND" in bad.stderr and "turbo" in bad.stderr


# The sum of rms_norm(ones((2, 8)), ones(8)) at eps = 1e-6, as the fallback runs below print it. Float32 lands within
# 2^-19 (32 units) of it: a few units for the rsqrt of the rounded 1 + eps, at most 15 for the 16-term sum.
_FALLBACK_TOTAL, _FALLBACK_REL = 16 / math.sqrt(1 + 1e-6), 2 ** -19


def test_missing_library_warns_once_and_falls_back(tmp_path):
    result = _run_python("""
        import warnings, jax.numpy as jnp
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            from jax_aiter.rmsnorm import rms_norm
            from jax_aiter.activation import silu_and_mul
            y = rms_norm(jnp.ones((2, 8)), jnp.ones(8))
            z = silu_and_mul(jnp.ones((2, 8)))
        print(float(y.sum()), float(z.sum()))
        print(sum("libjax_aiter_cpu.so not found" in str(w.message) for w in caught))
    """, JAX_AITER_LIB_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    total, count = result.stdout.split("\n")[:2]
    assert float(total.split()[0]) == pytest.approx(_FALLBACK_TOTAL, rel=_FALLBACK_REL)
    assert count == "1"


def test_broken_library_is_reported_not_raised(tmp_path):
    (tmp_path / "libjax_aiter_cpu.so").write_bytes(b"not an ELF file")
    result = _run_python("""
        import jax_aiter
        from jax_aiter import _native
        print(_native.load("cpu").problem)
    """, JAX_AITER_LIB_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "is not a 64-bit little-endian ELF file" in result.stdout


# --- loading: by absolute path, checked before dlopen, only for present platforms -------------------------------

_CPU_LIBRARY = _native.library_dir() / "libjax_aiter_cpu.so"
needs_cpu_library = pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")

_FALLBACK_RUN = """
    import warnings, jax.numpy as jnp
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        from jax_aiter import _native
        from jax_aiter.rmsnorm import rms_norm
        y = rms_norm(jnp.ones((2, 8)), jnp.ones(8))
    print(float(y.sum()))
    print(_native.load("cpu").problem)
    print(sum("libjax_aiter_cpu.so" in str(w.message) for w in caught))
"""


def _copy_library(directory, transform=lambda data: data, record=True):
    data = _CPU_LIBRARY.read_bytes()
    (directory / _CPU_LIBRARY.name).write_bytes(transform(data))
    if record:
        (directory / (_CPU_LIBRARY.name + ".record")).write_text(
            (_CPU_LIBRARY.parent / (_CPU_LIBRARY.name + ".record")).read_text())


@needs_cpu_library
@pytest.mark.parametrize("record", [True, False], ids=["with-record", "without-record"])
def test_truncated_library_disables_the_backend_instead_of_crashing(tmp_path, record):
    """An interrupted install leaves a truncated file: mapping it would kill the process with SIGBUS."""
    _copy_library(tmp_path, lambda data: data[: len(data) // 2], record=record)
    result = _run_python(_FALLBACK_RUN, JAX_AITER_LIB_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    total, problem, warned = result.stdout.split("\n")[:3]
    assert float(total) == pytest.approx(_FALLBACK_TOTAL, rel=_FALLBACK_REL)
    assert ("differs from its build record" if record else "is truncated") in problem
    assert str(tmp_path) in problem and warned == "1"


@needs_cpu_library
def test_altered_library_of_the_same_size_is_refused(tmp_path):
    _copy_library(tmp_path, lambda data: data[:-1] + bytes([data[-1] ^ 1]))
    result = _run_python(_FALLBACK_RUN, JAX_AITER_LIB_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "sha256 mismatch" in result.stdout.split("\n")[1]


def test_build_record_is_written_for_the_installed_library():
    if not _CPU_LIBRARY.is_file():
        pytest.skip("no CPU library built")
    import hashlib
    import json

    record = json.loads((_CPU_LIBRARY.parent / (_CPU_LIBRARY.name + ".record")).read_text())
    data = _CPU_LIBRARY.read_bytes()
    assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@needs_cpu_library
@pytest.mark.parametrize("given", ["relative", "dot"])
def test_library_directory_is_resolved_once_to_an_absolute_path(tmp_path, given):
    """A relative JAX_AITER_LIB_DIR means the directory at import time, and the file is opened by its absolute
    path (a bare name would let dlopen search LD_LIBRARY_PATH)."""
    lib_dir = tmp_path / "libs"
    lib_dir.mkdir()
    _copy_library(lib_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        import jax_aiter, jax.numpy as jnp
        from jax_aiter import _native
        os.chdir({str(elsewhere)!r})
        from jax_aiter.rmsnorm import rms_norm
        rms_norm(jnp.ones((2, 8)), jnp.ones(8)).block_until_ready()
        lib = _native.load("cpu")
        print(lib.problem, lib.path, lib.path.is_absolute())
        print(_native.describe()[0])
    """)], capture_output=True, text=True, timeout=300, cwd=tmp_path if given == "relative" else lib_dir,
        env={**os.environ, "JAX_AITER_LIB_DIR": "libs" if given == "relative" else "."})
    assert result.returncode == 0, result.stderr
    loaded, described = result.stdout.split("\n")[:2]
    assert loaded == f"None {lib_dir / _CPU_LIBRARY.name} True"
    assert described.startswith(f"libraries from {lib_dir} (JAX_AITER_LIB_DIR=")


@needs_cpu_library
def test_only_libraries_of_present_platforms_are_opened(tmp_path):
    """A CUDA library on a CPU-only machine is checked, not opened."""
    _copy_library(tmp_path)
    (tmp_path / "libjax_aiter_cuda.so").write_bytes(_CPU_LIBRARY.read_bytes())
    result = _run_python("""
        import jax_aiter
        from jax_aiter import _native
        print(jax_aiter.info())
        maps = open("/proc/self/maps").read()
        print("cpu mapped", "libjax_aiter_cpu.so" in maps, "cuda mapped", "libjax_aiter_cuda.so" in maps)
    """, JAX_AITER_LIB_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "cpu mapped True cuda mapped False" in result.stdout
    assert "library cuda: " + str(tmp_path / "libjax_aiter_cuda.so") + " (checked, not loaded: no cuda device here)" \
        in result.stdout


def test_a_library_without_the_ops_targets_is_not_selected(tmp_path):
    """A stale build that loads but lacks a target: the op takes the next implementation and info says why."""
    src = tmp_path / "stale.cc"
    src.write_text(textwrap.dedent("""
        #include <cstddef>
        #include "xla/ffi/api/ffi.h"
        namespace ffi = xla::ffi;
        static ffi::Error Copy(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) { return ffi::Error::Success(); }
        XLA_FFI_DEFINE_HANDLER_SYMBOL(StaleForward, Copy, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
        struct Entry { const char* name; void* handler; };
        static Entry table[] = {{"ja_silu_and_mul_fwd", reinterpret_cast<void*>(StaleForward)}};
        extern "C" __attribute__((visibility("default"))) Entry* ja_ffi_targets(size_t* count) {
          *count = 1;
          return table;
        }
    """))
    subprocess.run(["c++", "-std=c++17", "-shared", "-fPIC", f"-I{jax.ffi.include_dir()}", str(src), "-o",
                    str(tmp_path / "libjax_aiter_cpu.so")], check=True)
    result = _run_python("""
        import jax.numpy as jnp
        import jax_aiter
        from jax_aiter.activation import silu_and_mul
        print(float(silu_and_mul(jnp.ones((2, 8))).sum()))
        print([line for line in jax_aiter.info().splitlines() if "silu_and_mul" in line and " cpu " in line][0])
    """, JAX_AITER_LIB_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    total, line = result.stdout.split("\n")[:2]
    # 8 silu(1) = 8 sigmoid(1) in float32: a few units for exp, 1 + e and the quotient, 7 for the 8-term sum.
    assert float(total) == pytest.approx(8 / (1 + math.exp(-1)), rel=2 ** -20)
    assert "-> xla" in line and "lacks FFI target(s) ja_silu_and_mul_bwd (a stale build" in line


def test_info_names_every_op_and_reason():
    text = jax_aiter.info()
    for op in ("rms_norm", "rms_norm_with_add", "silu_and_mul", "gemm"):
        assert f"{op} " in text
    assert "library cpu:" in text and "library hip: unavailable" in text
    # Every platform row says what it takes, and rejected implementations carry their reason.
    rocm_rows = [line for line in text.splitlines() if " rocm " in line and line.split()[0] == "rms_norm"]
    assert rocm_rows and "-> xla" in rocm_rows[0] and "libjax_aiter_hip.so not found" in rocm_rows[0]


def test_cli_info_runs():
    result = subprocess.run([sys.executable, "-m", "jax_aiter.cli", "info"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "rms_norm" in result.stdout and "platform present on this machine" in result.stdout


def test_dispatch_combines_platforms_in_one_program():
    # With a native CPU kernel and a reference elsewhere, one traced program serves every platform.
    if _native.load("cpu").problem:
        pytest.skip("native CPU library not built")
    x, g = jnp.arange(32, dtype=jnp.float32).reshape(2, 16), jnp.ones(16)
    with jax_aiter.use_backend(rms_norm="native"):
        lowered = jax.jit(rms_norm).trace(x, g).lower(lowering_platforms=("cpu", "cuda", "rocm"))
        assert "ja_rms_norm_fwd" in lowered.as_text()
        exported = jax_aiter.export(rms_norm, platforms=("cpu", "rocm"))(x, g)
        assert "ja_rms_norm_fwd" in exported.mlir_module()
        exported = jax.export.deserialize(exported.serialize())
        # The same native kernel on the same inputs: bit for bit.
        np.testing.assert_array_equal(np.asarray(exported.call(x, g)), np.asarray(rms_norm(x, g)))


def test_use_backend_rejects_a_name_that_is_not_a_string():
    with pytest.raises(TypeError, match="use_backend: default must be an implementation name"):
        with jax_aiter.use_backend(123):
            pass
    with pytest.raises(TypeError, match="use_backend: gemm must be an implementation name"):
        with jax_aiter.use_backend(gemm=["xla"]):
            pass


def test_environment_variable_rejects_an_unknown_op():
    bad = _run_python("import jax_aiter", JAX_AITER_BACKEND="rmsnorm=xla")
    assert bad.returncode != 0 and "unknown op 'rmsnorm'" in bad.stderr and "rms_norm" in bad.stderr


# --- jax_aiter.export ---------------------------------------------------------------------------------------------


def test_export_keeps_the_callers_disabled_checks_on_every_call():
    from jax_aiter.activation import silu_and_mul

    extra = jax.export.DisabledSafetyCheck.custom_call("some_other_target")
    exporter = jax_aiter.export(silu_and_mul, platforms=("cpu",), disabled_checks=[extra])
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    for _ in range(2):
        exported = exporter(x)
        assert extra in exported.disabled_safety_checks


@pytest.mark.parametrize("platforms, error, match", [
    ("cpu", None, None),
    (("cpu", "rocm"), None, None),
    ("gpu", ValueError, "platforms must name one or more of"),
    (("cpu", "metal"), ValueError, "platforms must name one or more of"),
    ((), ValueError, "platforms must name one or more of"),
    (3, TypeError, "platforms must be a platform name"),
])
def test_export_checks_platforms_before_tracing(platforms, error, match):
    from jax_aiter.activation import silu_and_mul

    if error is None:
        exported = jax_aiter.export(silu_and_mul, platforms=platforms)(jax.ShapeDtypeStruct((4, 8), jnp.float32))
        assert exported.platforms == ((platforms,) if isinstance(platforms, str) else platforms)
    else:
        with pytest.raises(error, match=match):
            jax_aiter.export(silu_and_mul, platforms=platforms)
