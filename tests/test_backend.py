import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from jax_aiter import _backend, _native
from jax_aiter.rmsnorm import rms_norm

X = jax.ShapeDtypeStruct((8, 64), jnp.bfloat16)
G = jax.ShapeDtypeStruct((64,), jnp.bfloat16)


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (import-time behaviour), with extra environment variables."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_preference_order_and_fallback_per_platform():
    native_ok = _native.load("cpu").problem is None
    assert _backend.select("rms_norm", "cpu", (X, G), {"epsilon": 1e-6}).name == ("native" if native_ok else "xla")
    # No ROCm build here: rocm falls back to the reference, whatever the CPU has.
    if _native.load("hip").problem:
        assert _backend.select("rms_norm", "rocm", (X, G), {"epsilon": 1e-6}).name == "xla"
    # A call the native kernel does not support (float32 gamma, bf16 x) takes the next implementation.
    g32 = jax.ShapeDtypeStruct((64,), jnp.float32)
    assert _backend.select("rms_norm", "cpu", (X, g32), {"epsilon": 1e-6}).name == "xla"


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
    assert float(total.split()[0]) == pytest.approx(16.0, rel=1e-5)
    assert count == "1"


def test_broken_library_is_reported_not_raised(tmp_path):
    (tmp_path / "libjax_aiter_cpu.so").write_bytes(b"not an ELF file")
    result = _run_python("""
        import jax_aiter
        from jax_aiter import _native
        print(_native.load("cpu").problem)
    """, JAX_AITER_LIB_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "failed to load" in result.stdout


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
    lowered = jax.jit(rms_norm).trace(x, g).lower(lowering_platforms=("cpu", "cuda", "rocm"))
    assert "ja_rms_norm_fwd" in lowered.as_text()
    exported = jax_aiter.export(rms_norm, platforms=("cpu", "rocm"))(x, g)
    assert "ja_rms_norm_fwd" in exported.mlir_module()
    exported = jax.export.deserialize(exported.serialize())
    np.testing.assert_allclose(np.asarray(exported.call(x, g)), np.asarray(rms_norm(x, g)), rtol=1e-6)
