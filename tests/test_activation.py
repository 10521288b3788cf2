"""silu_and_mul: every implementation against float64 numpy, and the native kernels against the reference on
the CPU and (marked gpu) a GPU."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hypothesis
from hypothesis import strategies as st

import _property
import jax_aiter
from jax_aiter import _native
from jax_aiter.activation import silu_and_mul

import _oracle


@pytest.fixture(params=["xla", "native"])
def impl(request):
    if request.param == "native" and _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    return request.param


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 34), (1, 2)])
def test_forward_matches_oracle(impl, dtype, shape):
    x = (3 * jax.random.normal(jax.random.key(1), shape, jnp.float32)).astype(dtype)
    with jax_aiter.use_backend(silu_and_mul=impl):
        out = jax.jit(silu_and_mul)(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    # One rounding to the dtype (half an ulp: RTOL/2 for bf16, RTOL/4 for f16, none for f32) of float32 math
    # good to ~3 units of 2^-24, which the rms term absorbs.
    _oracle.assert_close(out, _oracle.silu_and_mul(x), dtype, factor=0.5)


def test_known_values(impl):
    # silu(0) = 0, silu(ln 3)= ln3 * 3/4; the up half scales the result.
    x = jnp.array([[0.0, np.log(3.0), 5.0, 2.0]], jnp.float32)
    with jax_aiter.use_backend(silu_and_mul=impl):
        out = silu_and_mul(x)
    # Float32: silu's ~3 units of 2^-24 and 1.3 from rounding ln 3 to float32 (silu's log-slope there is 1.27).
    np.testing.assert_allclose(np.asarray(out), [[0.0, np.log(3.0) * 0.75 * 2.0]], rtol=2 ** -21)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradient_matches_hand_derived(impl, dtype):
    x = (2 * jax.random.normal(jax.random.key(2), (6, 40), jnp.float32)).astype(dtype)
    dout = jax.random.normal(jax.random.key(3), (6, 20), jnp.float32).astype(dtype)
    with jax_aiter.use_backend(silu_and_mul=impl):
        _, vjp = jax.vjp(silu_and_mul, x)
        (dx,) = vjp(dout)
    assert dx.dtype == dtype
    # One rounding to the dtype (RTOL/2 for bf16) of float32 math: ~10 units of 2^-24 of the result, and ~10 of
    # |dout * up * s| where 1 + g (1 - s) cancels (g near -1.28), inside f32's RTOL/2 (84 units) and the rms term.
    _oracle.assert_close(dx, _oracle.silu_and_mul_grad(x, dout), dtype, factor=0.5)


def test_oracle_gradient_against_finite_differences():
    rng = np.random.default_rng(1)
    x, dout = rng.normal(size=(2, 8)), rng.normal(size=(2, 4))
    # Float64 at eps = 1e-6: f's ~15 roundings of sum|terms| = 0.43 over 2 eps (7e-10), the step's own rounding
    # (7e-11) and the truncation eps^2 max|f'''| / 6 (1e-13).
    np.testing.assert_allclose(_oracle.silu_and_mul_grad(x, dout),
                               _oracle.central_difference(lambda v: np.sum(_oracle.silu_and_mul(v) * dout), x),
                               rtol=0, atol=2e-9)


def test_vmap_and_grad_under_jit(impl):
    x = jax.random.normal(jax.random.key(4), (3, 5, 16), jnp.float32)
    with jax_aiter.use_backend(silu_and_mul=impl):
        out = jax.jit(jax.vmap(silu_and_mul))(x)
        g = jax.jit(jax.grad(lambda v: jnp.sum(silu_and_mul(v) ** 2)))(x)
    # Float32 math as in the tests above: a few units of 2^-24 forward, ~13 backward (3 more from 2 * out).
    _oracle.assert_close(out, _oracle.silu_and_mul(x), jnp.float32, factor=0.5)
    want = _oracle.silu_and_mul_grad(x, 2 * _oracle.silu_and_mul(x))
    _oracle.assert_close(g, want, jnp.float32, factor=0.5)


@pytest.mark.parametrize("x, error, match", [
    (jnp.ones((2, 3)), ValueError, "must be even"),
    (jnp.ones((2, 4), jnp.int8), TypeError, "x must have dtype"),
    (jnp.ones(()), ValueError, "rank >= 1"),
])
def test_bad_input(x, error, match):
    with pytest.raises(error, match=match):
        silu_and_mul(x)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_two_argument_form_equals_the_fused_layout(impl, dtype):
    """silu_and_mul(gate, up) is silu_and_mul([gate | up]), forward and gradients (split back per input)."""
    k1, k2, k3 = jax.random.split(jax.random.key(5), 3)
    gate = (2 * jax.random.normal(k1, (3, 4, 24), jnp.float32)).astype(dtype)
    up = jax.random.normal(k2, (3, 4, 24), jnp.float32).astype(dtype)
    dout = jax.random.normal(k3, (3, 4, 24), jnp.float32).astype(dtype)
    with jax_aiter.use_backend(silu_and_mul=impl):
        out, vjp = jax.vjp(silu_and_mul, gate, up)
        d_gate, d_up = vjp(dout)
        fused_out, fused_vjp = jax.vjp(silu_and_mul, jnp.concatenate([gate, up], axis=-1))
        (d_fused,) = fused_vjp(dout)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(fused_out))
    np.testing.assert_array_equal(np.asarray(d_gate), np.asarray(d_fused[..., :24]))
    np.testing.assert_array_equal(np.asarray(d_up), np.asarray(d_fused[..., 24:]))
    # Against float32 math left unrounded: one rounding to the dtype plus two float32 programs' few units.
    _oracle.assert_close(out, np.asarray(jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)), dtype,
                         factor=0.5)


@pytest.mark.parametrize("gate, up, error, match", [
    (jnp.ones((2, 4)), jnp.ones((2, 5)), ValueError, "^up must have gate's shape"),
    (jnp.ones((2, 4)), jnp.ones((2, 4), jnp.bfloat16), TypeError, "^up must have the dtype of gate"),
    (jnp.ones((2, 4), jnp.int32), jnp.ones((2, 4), jnp.int32), TypeError, "^gate must have dtype"),
    (jnp.ones(()), jnp.ones(()), ValueError, "^gate must have rank >= 1"),
    (jnp.ones((2, 4)), [1.0], TypeError, "^up must be an array"),
])
def test_two_argument_form_bad_input(gate, up, error, match):
    with pytest.raises(error, match=match):
        silu_and_mul(gate, up)


# --- the native kernels (csrc/cpu/activation.cc, csrc/gpu/activation.cu) against the reference: ~1 ulp ---------
# On the CPU and, marked gpu, on a GPU.


def _native_inputs(shape, dtype, seed):
    kx, kd = jax.random.split(jax.random.key(seed))
    x = (2.0 * jax.random.normal(kx, shape)).astype(dtype)
    dout = jax.random.normal(kd, (*shape[:-1], shape[-1] // 2)).astype(dtype)
    return x, dout


@pytest.mark.parametrize("shape", [(64, 2 * 1024), (3, 2 * 33), (2, 5, 2 * 40)], ids=str)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_native_silu_and_mul_forward_and_grad(device, dtype, shape):
    x, dout = jax.device_put(_native_inputs(shape, dtype, seed=2), device)

    def run(x, dout):
        out, vjp = jax.vjp(silu_and_mul, x)
        return out, *vjp(dout)

    native, reference = _oracle.native_and_reference(run, x, dout)
    # Two float32 programs, each rounded once to the dtype: half an ulp each, RTOL for bf16 (half of it for f16),
    # and their float32 difference (~10 units of 2^-24 of dx's scale) inside the rms term.
    _oracle.assert_close(native[0], reference[0], dtype)
    _oracle.assert_close(native[1], reference[1], dtype)


def test_native_silu_and_mul_is_what_runs(device):
    """The forced native implementation lowers to the FFI targets (not silently to the reference): forward and
    backward kernels, except on CUDA, where XLA's fusions measured faster in both directions and run instead."""
    x = jax.device_put(jnp.ones((32, 64), jnp.bfloat16), device)
    grad = jax.grad(lambda x: silu_and_mul(x).astype(jnp.float32).sum())
    with jax_aiter.use_backend("native"):
        forward = jax.jit(silu_and_mul).lower(x).as_text()
        backward = jax.jit(grad).lower(x).as_text()
    on_cuda = device.platform in ("gpu", "cuda") and "rocm" not in device.client.platform_version.lower()
    assert ("ja_silu_and_mul_bwd" in backward) == (not on_cuda)
    assert ("ja_silu_and_mul_fwd" in forward) == (not on_cuda)


def test_native_silu_and_mul_errors_raise(device):
    """Calls the handler rejects raise an exception naming the problem and never crash the process."""
    out = jax.ShapeDtypeStruct
    with pytest.raises(jax.errors.JaxRuntimeError, match="x must be bfloat16, float16 or float32, got int32"):
        _oracle.ffi_call_now("ja_silu_and_mul_fwd", out((4, 32), jnp.int32),
                             jax.device_put(jnp.ones((4, 64), jnp.int32), device))
    with pytest.raises(jax.errors.JaxRuntimeError, match="must be even"):
        _oracle.ffi_call_now("ja_silu_and_mul_fwd", out((4, 16), jnp.bfloat16),
                             jax.device_put(jnp.ones((4, 33), jnp.bfloat16), device))
    with jax_aiter.use_backend("native"):
        with pytest.raises(ValueError, match="even"):
            silu_and_mul(jnp.ones((4, 7), jnp.bfloat16))


# --- one behaviour whichever implementation runs -------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (2, 0, 6)], ids=str)
def test_empty_inputs_give_empty_results(impl, shape):
    x = jnp.ones(shape, jnp.float32)
    with jax_aiter.use_backend(silu_and_mul=impl):
        assert silu_and_mul(x).shape == (*shape[:-1], shape[-1] // 2)
        assert jax.grad(lambda x: silu_and_mul(x).sum())(x).shape == shape


def test_forward_mode_fails_the_same_way_everywhere(impl):
    x = jnp.ones((2, 8), jnp.float32)
    with jax_aiter.use_backend(silu_and_mul=impl), pytest.raises(TypeError, match="forward-mode autodiff"):
        jax.jvp(silu_and_mul, (x,), (x,))


def test_second_order_gradient_equals_the_float64_formula(impl):
    """d/dx of sum(d/dx sum(silu_and_mul(x))): for out = silu(g) * u, the inner gradient is
    [u * silu'(g), silu(g)], and its derivative summed over outputs is [u * silu''(g) + silu'(g), silu'(g)]."""
    x = np.random.default_rng(7).standard_normal((3, 10))
    with jax_aiter.use_backend(silu_and_mul=impl):
        got = jax.grad(lambda x: jax.grad(lambda x: silu_and_mul(x).sum())(x).sum())(jnp.asarray(x, jnp.float32))
    g, u = x[:, :5], x[:, 5:]
    s = 1 / (1 + np.exp(-g))
    d1 = s * (1 + g * (1 - s))
    d2 = s * (1 - s) * (2 + g * (1 - 2 * s))
    # Float32, ~20 roundings with 1 - s and 1 - 2s cancelling, scaled by |g|, |u| < 3: up to ~50 units of 2^-24
    # (3e-6) at results ~1, within rtol (168 units) + atol (17 units where the result is near 0).
    np.testing.assert_allclose(np.asarray(got), np.concatenate([u * d2 + d1, d1], axis=1), rtol=1e-5, atol=1e-6)


# --- property-based (slow tier): native == reference within the ulp bound, malformed calls never crash ------------

SILU_PROPERTY_SHAPES = [(1, 2), (3, 2), (1, 66), (5, 34), (0, 8), (4, 512), (2, 3, 96), (1, 16386), (7, 1000)]


@functools.cache
def _jitted_silu(impl):
    def run(x):
        with jax_aiter.use_backend(silu_and_mul=impl):
            return silu_and_mul(x)
    return jax.jit(run)


@pytest.mark.slow
@pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")
@hypothesis.settings(max_examples=3000, deadline=None, suppress_health_check=list(hypothesis.HealthCheck),
                     phases=(hypothesis.Phase.generate,))
@hypothesis.given(data=st.data())
def test_native_silu_and_mul_matches_the_reference_on_generated_inputs(data):
    shape = data.draw(st.sampled_from(SILU_PROPERTY_SHAPES))
    dtype = data.draw(st.sampled_from(sorted(_property.DTYPES)))
    x = data.draw(_property.values(dtype, shape))
    _property.assert_same_specials_and_close(_jitted_silu("native")(x), _jitted_silu("xla")(x),
                                             _property.DTYPES[dtype])


@pytest.mark.slow
@pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")
@hypothesis.settings(max_examples=8, deadline=None, phases=(hypothesis.Phase.generate,))
@hypothesis.given(data=st.data())
def test_malformed_silu_and_mul_calls_raise_and_never_crash(data):
    """A well-formed forward or backward call with one operand or result made wrong (dtype, or one dimension grown
    by one: an odd [gate | up] width, or sizes that disagree); 25 of them per child process."""
    cases = []
    for _ in range(25):
        backward = data.draw(st.booleans())
        rows, half = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 70))
        dtype = data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))
        x, out = [[rows, 2 * half], dtype], [[rows, half], dtype]
        case = ({"target": "ja_silu_and_mul_bwd", "inputs": [out, x], "outputs": [x], "attrs": {}} if backward
                else {"target": "ja_silu_and_mul_fwd", "inputs": [x], "outputs": [out], "attrs": {}})
        _property.break_one_slot(case, data.draw)
        cases.append(case)
    _property.malformed_calls_survive(cases)
