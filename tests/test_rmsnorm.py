"""rms_norm and rms_norm_with_add: every implementation against float64 numpy, and the native kernels against
the reference on the CPU and (marked gpu) a GPU."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hypothesis
from hypothesis import strategies as st

import _property
import jax_aiter
from jax_aiter import _backend, _native
from jax_aiter.ref import rmsnorm as _ref
from jax_aiter.rmsnorm import rms_norm, rms_norm_with_add

import _oracle

DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]
IMPLS = ["xla", "native"]


@pytest.fixture(params=IMPLS)
def impl(request):
    if request.param == "native" and _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    return request.param


def _inputs(shape, dtype, seed=0):
    kx, kg, kr, kd = jax.random.split(jax.random.key(seed), 4)
    x = (2.0 * jax.random.normal(kx, shape, jnp.float32)).astype(dtype)
    gamma = (1.0 + 0.5 * jax.random.normal(kg, shape[-1:], jnp.float32)).astype(dtype)
    residual = jax.random.normal(kr, shape, jnp.float32).astype(dtype)
    dy = jax.random.normal(kd, shape, jnp.float32).astype(dtype)
    return x, gamma, residual, dy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 128), (1, 4096), (5, 33)])
def test_forward_matches_oracle(impl, dtype, shape):
    x, gamma, _, _ = _inputs(shape, dtype)
    with jax_aiter.use_backend(rms_norm=impl):
        y = jax.jit(rms_norm, static_argnums=2)(x, gamma, 1e-5)
    assert y.dtype == dtype and y.shape == shape
    _oracle.assert_close(y, _oracle.rms_norm(x, gamma, 1e-5), dtype, factor=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_with_add_matches_oracle(impl, dtype):
    x, gamma, residual, _ = _inputs((6, 96), dtype)
    with jax_aiter.use_backend(rms_norm_with_add=impl):
        y, total = rms_norm_with_add(x, residual, gamma, 1e-6)
    expected_total = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(total), np.asarray(expected_total))  # one rounding of the sum
    _oracle.assert_close(y, _oracle.rms_norm(expected_total, gamma, 1e-6), dtype, factor=2)


def test_epsilon_dominates_small_inputs(impl):
    x = jnp.full((2, 8), 1e-4, jnp.float32)
    with jax_aiter.use_backend(rms_norm=impl):
        y = rms_norm(x, jnp.ones(8, jnp.float32), epsilon=1.0)
    np.testing.assert_allclose(np.asarray(y), 1e-4 / np.sqrt(1e-8 + 1.0), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradients_match_hand_derived(impl, dtype):
    x, gamma, _, dy = _inputs((5, 48), dtype, seed=3)
    with jax_aiter.use_backend(rms_norm=impl):
        _, vjp = jax.vjp(lambda a, b: rms_norm(a, b, 1e-6), x, gamma)
        dx, dgamma = vjp(dy)
    want_dx, want_dgamma = _oracle.rms_norm_grads(x, gamma, 1e-6, dy)
    assert dx.dtype == dtype and dgamma.dtype == dtype
    _oracle.assert_close(dx, want_dx, dtype, factor=4)
    _oracle.assert_close(dgamma, want_dgamma, dtype, factor=4)


def test_oracle_gradient_formula_against_finite_differences():
    rng = np.random.default_rng(0)
    x, gamma, dy = rng.normal(size=(3, 6)), rng.normal(size=6), rng.normal(size=(3, 6))
    dx, dgamma = _oracle.rms_norm_grads(x, gamma, 1e-3, dy)
    np.testing.assert_allclose(dx, _oracle.central_difference(lambda v: np.sum(_oracle.rms_norm(v, gamma, 1e-3) * dy), x),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dgamma, _oracle.central_difference(
        lambda g: np.sum(_oracle.rms_norm(x, g, 1e-3) * dy), gamma), rtol=1e-6, atol=1e-8)


def test_with_add_gradients(impl):
    x, gamma, residual, dy = _inputs((4, 32), jnp.float32, seed=5)
    d_total = jax.random.normal(jax.random.key(9), x.shape, jnp.float32)
    with jax_aiter.use_backend(rms_norm_with_add=impl):
        _, vjp = jax.vjp(lambda a, r, g: rms_norm_with_add(a, r, g), x, residual, gamma)
        dx, dres, dgamma = vjp((dy, d_total))
    total = _oracle.f64(x) + _oracle.f64(residual)
    want_dx, want_dgamma = _oracle.rms_norm_grads(total, gamma, 1e-6, dy)
    _oracle.assert_close(dx, want_dx + _oracle.f64(d_total), jnp.float32, factor=4)
    _oracle.assert_close(dres, want_dx + _oracle.f64(d_total), jnp.float32, factor=4)
    _oracle.assert_close(dgamma, want_dgamma, jnp.float32, factor=4)


def test_vmap_and_mixed_dtype_gamma(impl):
    x, gamma, _, _ = _inputs((3, 4, 16), jnp.bfloat16)
    with jax_aiter.use_backend(rms_norm=impl):
        y = jax.vmap(lambda a: rms_norm(a, gamma))(x)
        # float32 gamma with bfloat16 x is outside the native kernel's contract: selection falls back to xla.
        gamma32 = gamma.astype(jnp.float32)
    _oracle.assert_close(y, _oracle.rms_norm(x, gamma, 1e-6), jnp.bfloat16, factor=2)
    chosen = _backend.select("rms_norm", "cpu", (x, gamma32), {"epsilon": 1e-6})
    assert chosen.name == "xla"
    _oracle.assert_close(rms_norm(x, gamma32), _oracle.rms_norm(x, gamma32, 1e-6), jnp.bfloat16, factor=2)


def test_native_lowers_to_custom_call():
    if _native.load("cpu").problem:
        pytest.skip("native CPU library not built")
    x, gamma, _, _ = _inputs((4, 16), jnp.float32)
    with jax_aiter.use_backend(rms_norm="native"):
        text = jax.jit(rms_norm).trace(x, gamma).lower(lowering_platforms=("cpu",)).as_text()
    assert "ja_rms_norm_fwd" in text
    with jax_aiter.use_backend("xla"):
        assert "ja_rms_norm_fwd" not in jax.jit(rms_norm).trace(x, gamma).lower(lowering_platforms=("cpu",)).as_text()


def _kernel_calls(fn, *args, target):
    """How many custom calls to ``target`` the compiled (optimized) program makes."""
    return jax.jit(fn).lower(*args).compile().as_text().count(f'custom_call_target="{target}"')


@pytest.mark.parametrize("with_add", [False, True], ids=["rms_norm", "rms_norm_with_add"])
def test_native_residuals_are_named_for_remat(with_add):
    """Under jax.checkpoint the backward pass re-runs the forward kernel for its residuals; a policy that saves
    the named residuals keeps it out (the norm's output is not needed by the backward here)."""
    from jax_aiter.rmsnorm import CHECKPOINT_NAMES

    if _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    x, gamma, residual, _ = _inputs((64, 128), jnp.bfloat16)
    weights = jnp.arange(128, dtype=jnp.float32)

    def loss(x, residual, gamma):
        x = jnp.sin(x)  # the norm's input is recomputed, not saved
        if with_add:
            y, total = rms_norm_with_add(x, residual, gamma)
            return jnp.sum(y.astype(jnp.float32) * weights) + jnp.sum(total.astype(jnp.float32))
        return jnp.sum(rms_norm(x, gamma).astype(jnp.float32) * weights)

    target = "ja_add_rms_norm_fwd" if with_add else "ja_rms_norm_fwd"
    saved = jax.checkpoint(loss, policy=jax.checkpoint_policies.save_only_these_names(*CHECKPOINT_NAMES))
    results = {}
    with jax_aiter.use_backend("native"):
        for name, fn in (("plain", loss), ("remat", jax.checkpoint(loss)), ("saved", saved)):
            step = jax.value_and_grad(fn, argnums=(0, 1, 2))
            results[name] = (_kernel_calls(step, x, residual, gamma, target=target), jax.jit(step)(x, residual, gamma))
    assert {name: calls for name, (calls, _) in results.items()} == {"plain": 1, "remat": 2, "saved": 1}
    for name in ("remat", "saved"):  # the names change what is kept, never a value
        for got, want in zip(jax.tree.leaves(results[name][1]), jax.tree.leaves(results["plain"][1])):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("call, error, match", [
    (lambda: rms_norm(jnp.ones((2, 8), jnp.int32), jnp.ones(8)), TypeError, "x must have dtype"),
    (lambda: rms_norm(jnp.ones((2, 8)), jnp.ones(7)), ValueError, "gamma must have x's last dimension"),
    (lambda: rms_norm(jnp.ones((2, 8)), jnp.ones((1, 8))), ValueError, "gamma must have rank 1"),
    (lambda: rms_norm(jnp.ones(()), jnp.ones(1)), ValueError, "x must have rank >= 1"),
    (lambda: rms_norm(jnp.ones((2, 8)), jnp.ones(8), epsilon=-1.0), ValueError, "epsilon"),
    (lambda: rms_norm([1.0, 2.0], jnp.ones(2)), TypeError, "x must be an array"),
    (lambda: rms_norm_with_add(jnp.ones((2, 8)), jnp.ones((2, 4)), jnp.ones(8)), ValueError, "residual must have"),
    (lambda: rms_norm_with_add(jnp.ones((2, 8)), jnp.ones((2, 8), jnp.bfloat16), jnp.ones(8)), TypeError, "residual"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- the native kernels (csrc/cpu/rmsnorm.cc, csrc/gpu/rmsnorm.cu) against the reference: ~1 ulp ---------------
# On the CPU and, marked gpu, on a GPU; the kernels sum in another order than XLA.


def norm_inputs(shape, dtype, seed=0):
    kx, kg, kr, kd, ks = jax.random.split(jax.random.key(seed), 5)
    x = (2.0 * jax.random.normal(kx, shape)).astype(dtype)
    gamma = (1.0 + 0.5 * jax.random.normal(kg, shape[-1:])).astype(dtype)
    residual = jax.random.normal(kr, shape).astype(dtype)
    dy = jax.random.normal(kd, shape).astype(dtype)
    d_sum = jax.random.normal(ks, shape).astype(dtype)
    return x, gamma, residual, dy, d_sum


def assert_close_tree(native, reference, dtype, factor=1.0):
    for a, b in zip(jax.tree.leaves(native), jax.tree.leaves(reference), strict=True):
        _oracle.assert_close(a, b, dtype, factor=factor)


# (7, 33): columns that allow no 16-byte access; (2, 40000): rows longer than the GPU kernel keeps in registers.
NORM_SHAPES = [(64, 1024), (3, 5, 96), (7, 33), (2, 40000), (1, 8)]


@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_rms_norm_forward_and_grads(device, dtype, shape):
    x, gamma, _, dy, _ = jax.device_put(norm_inputs(shape, dtype), device)

    def run(x, gamma, dy):
        y, vjp = jax.vjp(functools.partial(rms_norm, epsilon=1e-6), x, gamma)
        return y, *vjp(dy)

    native, reference = _oracle.native_and_reference(run, x, gamma, dy)
    assert_close_tree(native[0], reference[0], dtype)
    # Gradients sum over a row (dx) or over all rows (dgamma) in another order: a little more slack.
    assert_close_tree(native[1:], reference[1:], dtype, factor=2)


@pytest.mark.parametrize("shape", [(32, 4096), (5, 33), (3, 20000)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_native_rms_norm_with_add_forward_and_grads(device, dtype, shape):
    x, gamma, residual, dy, d_sum = jax.device_put(norm_inputs(shape, dtype, seed=1), device)

    def run(x, residual, gamma, dy, d_sum):
        (y, total), vjp = jax.vjp(functools.partial(rms_norm_with_add, epsilon=1e-5), x, residual, gamma)
        return y, total, *vjp((dy, d_sum))

    native, reference = _oracle.native_and_reference(run, x, residual, gamma, dy, d_sum)
    np.testing.assert_array_equal(native[1], reference[1])  # the sum is rounded once, identically
    assert_close_tree(native[0], reference[0], dtype)
    assert_close_tree(native[2:], reference[2:], dtype, factor=2)


def test_native_rms_norm_is_what_runs(device):
    """The forced native implementation lowers to the FFI targets (not silently to the reference): the forward
    and the backward kernel, on every platform."""
    x = jax.device_put(jnp.ones((32, 64), jnp.bfloat16), device)
    grad = jax.grad(lambda x: rms_norm(x, x[0]).astype(jnp.float32).sum())
    with jax_aiter.use_backend("native"):
        forward = jax.jit(lambda x: rms_norm(x, x[0])).lower(x).as_text()
        backward = jax.jit(grad).lower(x).as_text()
    assert "ja_rms_norm_fwd" in forward
    assert "ja_rms_norm_bwd" in backward


def test_native_rms_norm_errors_raise(device):
    """A call the handler rejects raises an exception naming the problem and never crashes the process."""
    bf16 = jnp.bfloat16
    x = jax.device_put(jnp.ones((4, 64), bf16), device)
    out = jax.ShapeDtypeStruct
    with pytest.raises(jax.errors.JaxRuntimeError, match="gamma must be 1-D with x's last dimension"):
        _oracle.ffi_call_now("ja_rms_norm_fwd", (out((4, 64), bf16), out((4,), jnp.float32)), x, x[0, :32],
                             epsilon=np.float32(1e-6))


# --- one behaviour whichever implementation runs -------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [1e-50, 1e-39, float("inf"), 0.0, -1e-6])
def test_epsilon_must_be_a_normal_float32(epsilon):
    """1e-50 is 0 in float32 (an all-zero row would give NaN); 1e-39 is subnormal there."""
    x = jnp.zeros((2, 8), jnp.float32)
    with pytest.raises(ValueError, match="epsilon must be"):
        rms_norm(x, jnp.ones(8), epsilon=epsilon)


def test_smallest_normal_epsilon_keeps_an_all_zero_row_finite(impl):
    with jax_aiter.use_backend(rms_norm=impl):
        y = rms_norm(jnp.zeros((2, 8), jnp.float32), jnp.ones(8), epsilon=float(np.finfo(np.float32).tiny))
    np.testing.assert_array_equal(np.asarray(y), 0.0)


def test_residual_that_is_not_an_array_is_named():
    x = jnp.ones((2, 8), jnp.float32)
    with pytest.raises(TypeError, match="residual must be an array, got list"):
        rms_norm_with_add(x, [[1.0] * 8] * 2, jnp.ones(8))


@pytest.mark.parametrize("shape", [(4, 0), (0, 8), (2, 0, 8)], ids=str)
def test_empty_inputs_give_empty_results(impl, shape):
    x = jnp.ones(shape, jnp.float32)
    gamma = jnp.ones(shape[-1:], jnp.float32)
    with jax_aiter.use_backend(rms_norm=impl, rms_norm_with_add=impl):
        assert rms_norm(x, gamma).shape == shape
        y, total = rms_norm_with_add(x, x, gamma)
        assert y.shape == total.shape == shape
        assert jax.grad(lambda x: rms_norm(x, gamma).sum())(x).shape == shape


def test_forward_mode_fails_the_same_way_everywhere(impl):
    x = jnp.ones((2, 8), jnp.float32)
    with jax_aiter.use_backend(rms_norm=impl), pytest.raises(TypeError, match="forward-mode autodiff"):
        jax.jvp(lambda x: rms_norm(x, jnp.ones(8)), (x,), (x,))


def test_second_order_gradients_agree_across_implementations():
    """grad of grad through rms_norm and rms_norm_with_add runs on every implementation (the native one's
    kernels carry the reference's derivative) and equals JAX's second derivative of the reference."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((3, 16)), jnp.float32)
    gamma = jnp.asarray(1 + 0.1 * rng.standard_normal(16), jnp.float32)

    def second_order(fn):
        inner = jax.grad(lambda x: jnp.sum(fn(x) ** 3))
        return jax.grad(lambda x: jnp.sum(inner(x) * jnp.arange(16.0)))(x)

    results = {}
    for name in IMPLS:
        if name == "native" and _native.load("cpu").problem:
            continue
        with jax_aiter.use_backend(name):
            results[name] = (second_order(lambda z: rms_norm(z, gamma)),
                             second_order(lambda z: rms_norm_with_add(z, 0.5 * z, gamma)[0]))
    with jax_aiter.use_backend("xla"):
        unwrapped = (second_order(lambda z: _ref.rms_norm(z, gamma, epsilon=1e-6)),
                     second_order(lambda z: _ref.rms_norm_with_add(z, 0.5 * z, gamma, epsilon=1e-6)[0]))
    for name, got in results.items():
        for a, b in zip(got, unwrapped):
            assert np.isfinite(np.asarray(a)).all()
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4, err_msg=name)


# --- every finite input: rows whose float32 sum of squares overflows, tiny rows, specials -----------------------
# Against the float64 oracle (exact far beyond these magnitudes). XLA's CPU runtime flushes subnormals to zero, in
# every implementation alike: on the CPU a subnormal input reads as 0 and the oracle is given the same.

F32_MAX = float(np.finfo(np.float32).max)
BF16_MAX = float(jnp.finfo(jnp.bfloat16).max)


def _extreme_rows(kind, cols, dtype):
    """Three rows of magnitude ``kind`` times seeded values in ±[0.5, 1), as ``dtype``; ``mixed``: ordinary
    values, every other one times 1e-30, and one near the dtype's largest value."""
    rng = np.random.default_rng(cols)
    base = rng.uniform(0.5, 1.0, (3, cols)) * rng.choice([-1.0, 1.0], (3, cols))
    if kind == "mixed":
        base[:, 1::2] *= 1e-30
        base[:, 0] = np.sign(base[:, 0]) * (BF16_MAX if dtype == jnp.bfloat16 else 3e38)
    else:
        base *= {"1e20": 1e20, "3e38": 3e38, "bf16_max": BF16_MAX, "1e-30": 1e-30, "subnormal": 2.0 ** -140}[kind]
    return jnp.asarray(base, jnp.float32).astype(dtype)


def _as_read(x, platform):
    """x as the platform's arithmetic reads it (float64): the CPU flushes subnormals to zero."""
    x = _oracle.f64(x)
    if platform == "cpu":
        x = np.where(np.abs(x) < np.finfo(np.float32).tiny, 0.0, x)
    return x


EXTREME_CASES = [("1e20", jnp.float32), ("3e38", jnp.float32), ("bf16_max", jnp.bfloat16), ("1e20", jnp.bfloat16),
                 ("1e-30", jnp.float32), ("1e-30", jnp.bfloat16), ("subnormal", jnp.float32),
                 ("mixed", jnp.float32), ("mixed", jnp.bfloat16)]


def _value_and_vjp(impl, x, gamma, dy):
    with jax_aiter.use_backend(rms_norm=impl):
        y, vjp = jax.vjp(functools.partial(rms_norm, epsilon=1e-6), x, gamma)
        return y, vjp(dy)


@pytest.mark.parametrize("cols", [1, 33, 4096, 40000])
@pytest.mark.parametrize("kind, dtype", EXTREME_CASES, ids=[f"{k}-{jnp.dtype(d).name}" for k, d in EXTREME_CASES])
def test_extreme_rows_match_the_float64_oracle(device, impl, kind, dtype, cols):
    """rms_norm and its gradients at magnitudes whose squares overflow float32 (1e20, 3e38, bfloat16's largest)
    or underflow it (1e-30, subnormals), and rows mixing them. (1: no reduction left for the compiler, whose
    rewrites of the products then reach the scaling; 33: no 16-byte access; 40000: longer than the GPU kernels
    hold in registers.) Under jit, as users run it. dy is scaled with the rows so that dx = dy * gamma / rms is
    a normal float32; the bounds are the ordinary tests' ulp bounds (tests/_oracle.py RTOL): the scaling is
    exact."""
    if device.platform != "cpu" and impl == "xla" and kind == "subnormal":
        pytest.skip("whether XLA's GPU code keeps subnormals is XLA's choice")
    x = jax.device_put(_extreme_rows(kind, cols, dtype), device)
    gamma = jax.device_put(jnp.asarray(np.linspace(0.5, 1.5, cols), dtype), device)
    rms_guess = float(np.sqrt(np.mean(_as_read(x, device.platform) ** 2)))
    dy_scale = max(rms_guess, 1.0) * 2.0 ** -10
    dy = jax.device_put((jax.random.normal(jax.random.key(7), x.shape) * dy_scale).astype(dtype), device)
    y, (dx, dgamma) = jax.jit(functools.partial(_value_and_vjp, impl))(x, gamma, dy)
    read = _as_read(x, device.platform)
    assert np.isfinite(np.asarray(y, np.float64)).all() and np.isfinite(np.asarray(dx, np.float64)).all()
    _oracle.assert_close(y, _oracle.rms_norm(read, gamma, 1e-6), dtype, factor=2)
    want_dx, want_dgamma = _oracle.rms_norm_grads(read, gamma, 1e-6, dy)
    # dx is a difference of two terms of size gamma*dy/rms; their size, not dx's, bounds its rounding (a row of
    # one element has dx ~ epsilon/x^2 from two terms that cancel).
    terms = _oracle.f64(gamma) * _oracle.f64(dy) / np.sqrt(np.mean(read ** 2, axis=-1, keepdims=True) + 1e-6)
    _oracle.assert_close(dx, want_dx, dtype, scale=float(np.sqrt(np.mean(terms ** 2))), factor=4)
    _oracle.assert_close(dgamma, want_dgamma, dtype, factor=4)


@pytest.mark.parametrize("cols", [4096, 40000])
@pytest.mark.parametrize("kind", ["3e38", "mixed"])
def test_extreme_rows_with_add(device, impl, kind, cols):
    """The fused add's norm reads the rounded sum: a sum near float32's largest value normalizes exactly. dy is
    scaled so that dx (about dy / rms) is a normal float32, d_total so that it weighs as much."""
    x = jax.device_put(_extreme_rows(kind, cols, jnp.float32), device)
    residual = jax.device_put(jnp.full(x.shape, 1.0, jnp.float32), device)
    gamma = jax.device_put(jnp.ones(cols, jnp.float32), device)
    dy = jax.device_put(jax.random.normal(jax.random.key(3), x.shape) * 2.0 ** 100, device)
    d_total = jax.device_put(jax.random.normal(jax.random.key(4), x.shape) * 2.0 ** -24, device)
    with jax_aiter.use_backend(rms_norm_with_add=impl):
        (y, total), vjp = jax.vjp(rms_norm_with_add, x, residual, gamma)
        dx, dres, dgamma = vjp((dy, d_total))
    total64 = _oracle.f64(total)
    _oracle.assert_close(y, _oracle.rms_norm(total64, gamma, 1e-6), jnp.float32, factor=2)
    want_dx, want_dgamma = _oracle.rms_norm_grads(total64, gamma, 1e-6, dy)
    _oracle.assert_close(dx, want_dx + _oracle.f64(d_total), jnp.float32, factor=4)
    _oracle.assert_close(dres, want_dx + _oracle.f64(d_total), jnp.float32, factor=4)
    _oracle.assert_close(dgamma, want_dgamma, jnp.float32, factor=4)


def test_native_forward_saves_the_rms(device):
    """The forward kernels' second result is sqrt(mean(x^2) + epsilon) per row, a normal float32 for every finite
    row (the backward kernel's residual): float32's largest values give float32's largest value, not Inf."""
    rows = np.stack([np.full(64, v) for v in (1e20, 3e38, F32_MAX, 1e-30, 0.0, 1.5)]).astype(np.float32)
    rows[1, ::2] = -3e38
    x, gamma = jax.device_put((jnp.asarray(rows), jnp.ones(64, jnp.float32)), device)
    out = (jax.ShapeDtypeStruct((6, 64), jnp.float32), jax.ShapeDtypeStruct((6,), jnp.float32))
    _, rms = _oracle.ffi_call_now("ja_rms_norm_fwd", out, x, gamma, epsilon=np.float32(1e-6))
    want = np.sqrt(np.mean(_oracle.f64(rows) ** 2, axis=-1) + np.float64(np.float32(1e-6)))
    want = np.minimum(want, F32_MAX)
    np.testing.assert_allclose(np.asarray(rms, np.float64), want, rtol=2 ** -22)  # a few float32 roundings


def test_zero_rows_with_the_smallest_epsilon_have_finite_gradients(impl):
    """dx of an all-zero row is gamma * dy / sqrt(epsilon): 2^63 * gamma * dy for the smallest normal epsilon,
    where a 1/rms^3 term (2^189) would overflow float32 and turn it into NaN."""
    tiny = float(np.finfo(np.float32).tiny)
    x = jnp.zeros((2, 8), jnp.float32)
    gamma = jnp.linspace(0.5, 1.5, 8, dtype=jnp.float32)
    dy = jax.random.normal(jax.random.key(2), x.shape)
    with jax_aiter.use_backend(rms_norm=impl):
        dx, dgamma = jax.vjp(lambda x, g: rms_norm(x, g, epsilon=tiny), x, gamma)[1](dy)
    want_dx, want_dgamma = _oracle.rms_norm_grads(x, gamma, np.float64(np.float32(tiny)), dy)
    _oracle.assert_close(dx, want_dx, jnp.float32)
    np.testing.assert_array_equal(np.asarray(dgamma), 0.0)
    assert np.abs(np.asarray(dx)).max() > 2.0 ** 60


def test_inf_and_nan_rows_propagate_and_leave_other_rows_exact(impl):
    """A row holding Inf normalizes to 0 at its finite elements and NaN at the Inf (Inf / Inf), a row holding NaN
    to NaN, and both give NaN gradients; the other rows of the same call are exact."""
    x = np.tile(np.linspace(-2.0, 2.0, 16, dtype=np.float32), (4, 1))
    x[1, 3] = np.inf
    x[2, 5] = np.nan
    x[3] *= 1e20
    x = jnp.asarray(x)
    gamma = jnp.ones(16, jnp.float32)
    dy = jnp.ones_like(x)
    with jax_aiter.use_backend(rms_norm=impl):
        y, vjp = jax.vjp(lambda x: rms_norm(x, gamma), x)
        (dx,) = vjp(dy)
    y, dx = np.asarray(y), np.asarray(dx)
    assert np.isnan(y[1, 3]) and (np.delete(y[1], 3) == 0).all()
    assert np.isnan(y[2]).all() and np.isnan(dx[1:3]).all()
    clean = np.asarray(x)[[0, 3]]
    _oracle.assert_close(y[[0, 3]], _oracle.rms_norm(clean, gamma, 1e-6), jnp.float32, factor=2)
    _oracle.assert_close(dx[[0, 3]], _oracle.rms_norm_grads(clean, gamma, 1e-6, np.ones_like(clean))[0], jnp.float32,
                         factor=4)


# --- long reductions (slow tier): accurate to ~1e-6 at 2^24 elements and more ---------------------------------


@pytest.mark.slow
def test_a_row_of_2_25_ones_normalizes_to_one(impl):
    n = 2 ** 25
    with jax_aiter.use_backend(rms_norm=impl):
        y = rms_norm(jnp.ones((1, n), jnp.float32), jnp.ones(n, jnp.float32), epsilon=1e-6)
    np.testing.assert_allclose(np.asarray(y[0, :: n // 64]), 1 / np.sqrt(1 + 1e-6), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("rows", [2 ** 21, 2 ** 24])
def test_dgamma_over_millions_of_rows(impl, rows):
    """dgamma sums dy * x / rms over every row: 2^24 rows of 4 columns, against the exact sum."""
    x = jnp.tile(jnp.asarray([[1.0, -2.0, 3.0, 0.5]], jnp.float32), (rows, 1))
    gamma = jnp.ones(4, jnp.float32)
    with jax_aiter.use_backend(rms_norm=impl):
        dgamma = jax.grad(lambda g: rms_norm(x, g, epsilon=1e-6).sum())(gamma)
    row = np.asarray([1.0, -2.0, 3.0, 0.5])
    want = rows * row / np.sqrt(np.mean(row ** 2) + 1e-6)
    np.testing.assert_allclose(np.asarray(dgamma, np.float64), want, rtol=1e-6)


# --- property-based (slow tier): native == reference within the ulp bound, malformed calls never crash ------------

NORM_PROPERTY_SHAPES = [(1, 1), (1, 7), (3, 1), (5, 33), (0, 8), (4, 256), (2, 3, 96), (1, 8193), (7, 1000)]


@pytest.mark.slow
@pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")
@hypothesis.settings(max_examples=3000, deadline=None, suppress_health_check=list(hypothesis.HealthCheck),
                     phases=(hypothesis.Phase.generate,))
@hypothesis.given(data=st.data())
def test_native_rms_norm_matches_the_reference_on_generated_inputs(data):
    shape = data.draw(st.sampled_from(NORM_PROPERTY_SHAPES))
    dtype = data.draw(st.sampled_from(sorted(_property.DTYPES)))
    fused = data.draw(st.booleans())
    x = data.draw(_property.values(dtype, shape))
    gamma = data.draw(_property.values(dtype, shape[-1:], special=False))
    residual = data.draw(_property.values(dtype, shape)) if fused else None
    results = {}
    for impl in ("native", "xla"):
        results[impl] = _jitted_norm(impl, fused)(x, gamma, residual)
    for got, want in zip(jax.tree.leaves(results["native"]), jax.tree.leaves(results["xla"])):
        _property.assert_same_specials_and_close(got, want, _property.DTYPES[dtype])


@functools.cache
def _jitted_norm(impl, fused):
    def run(x, gamma, residual):
        with jax_aiter.use_backend(impl):
            return rms_norm_with_add(x, residual, gamma) if fused else rms_norm(x, gamma)
    return jax.jit(run)


def _norm_call(target, rows, cols, dtype, blocks):
    """A well-formed call of ``target`` as {"target", "inputs", "outputs", "attrs"} (shapes and dtype names)."""
    full, row, vec = [[rows, cols], dtype], [[rows], "float32"], [[cols], dtype]
    if target == "ja_rms_norm_fwd":
        return {"target": target, "inputs": [full, vec], "outputs": [full, row], "attrs": {"epsilon": 1e-6}}
    if target == "ja_add_rms_norm_fwd":
        return {"target": target, "inputs": [full, full, vec], "outputs": [full, full, row], "attrs": {"epsilon": 1e-6}}
    return {"target": target, "inputs": [full, full, vec, row, full],
            "outputs": [full, vec, [[blocks, cols], "float32"]], "attrs": {}}


@pytest.mark.slow
@pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")
@hypothesis.settings(max_examples=8, deadline=None, phases=(hypothesis.Phase.generate,))
@hypothesis.given(data=st.data())
def test_malformed_rms_norm_calls_raise_and_never_crash(data):
    """Each case is a well-formed call of one of the three targets with one operand or result made wrong (its
    dtype, or one dimension grown by one); 25 of them run in a child process, which must not crash."""
    cases = []
    for _ in range(25):
        target = data.draw(st.sampled_from(["ja_rms_norm_fwd", "ja_add_rms_norm_fwd", "ja_rms_norm_bwd"]))
        rows, cols = data.draw(st.integers(2, 9)), data.draw(st.integers(2, 70))
        dtype = data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))
        case = _norm_call(target, rows, cols, dtype, data.draw(st.integers(1, rows)))

        def grow(side, index, axis, length, target=target, rows=rows):
            # The workspace may have any 1..rows blocks: only more than rows is wrong there.
            return rows + 1 if (target, side, index, axis) == ("ja_rms_norm_bwd", "outputs", 2, 0) else length + 1

        _property.break_one_slot(case, data.draw, grow)
        cases.append(case)
    _property.malformed_calls_survive(cases)
