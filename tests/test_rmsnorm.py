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


@pytest.mark.usefixtures("automatic_selection")
def test_native_lowers_to_custom_call():
    if _native.load("cpu").problem:
        pytest.skip("native CPU library not built")
    x, gamma, _, _ = _inputs((4, 16), jnp.float32)
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
    """The forced native implementation lowers to the FFI targets (not silently to the reference): forward and
    backward kernels, except on CUDA, where it takes XLA's forward (measured faster) and the backward kernel."""
    x = jax.device_put(jnp.ones((32, 64), jnp.bfloat16), device)
    grad = jax.grad(lambda x: rms_norm(x, x[0]).astype(jnp.float32).sum())
    with jax_aiter.use_backend("native"):
        forward = jax.jit(lambda x: rms_norm(x, x[0])).lower(x).as_text()
        backward = jax.jit(grad).lower(x).as_text()
    assert "ja_rms_norm_bwd" in backward
    on_cuda = device.platform in ("gpu", "cuda") and "rocm" not in device.client.platform_version.lower()
    assert ("ja_rms_norm_fwd" in forward) == (not on_cuda)


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
    """dgamma sums dy * x * inv_rms over every row: 2^24 rows of 4 columns, against the exact sum."""
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


@pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")
def test_cuda_variant_xla_forward_with_the_backward_kernel():
    """The native implementation's CUDA variant (XLA's forward, the backward kernel), run here on the CPU: the
    forward is the reference's own program, the gradient calls the backward kernel and equals the float64 one."""
    from jax_aiter.native import rmsnorm as native_rmsnorm

    x, gamma, _, dy = _inputs((8, 96), jnp.float32, seed=9)
    y, vjp = jax.vjp(lambda x, g: native_rmsnorm.rms_norm_xla_forward(x, g, epsilon=1e-6), x, gamma)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(_ref.rms_norm(x, gamma, epsilon=1e-6)))
    dx, dgamma = vjp(dy)
    want_dx, want_dgamma = _oracle.rms_norm_grads(x, gamma, 1e-6, dy)
    _oracle.assert_close(dx, want_dx, jnp.float32, factor=2)
    _oracle.assert_close(dgamma, want_dgamma, jnp.float32, factor=2)
    hlo = jax.jit(jax.grad(lambda x: native_rmsnorm.rms_norm_xla_forward(x, gamma, epsilon=1e-6).sum())).lower(
        x).as_text()
    assert "ja_rms_norm_bwd" in hlo and "ja_rms_norm_fwd" not in hlo
    declared = next(i for i in _backend.implementations("rms_norm") if i.name == "native")
    assert declared.fn_for("cuda") is native_rmsnorm.rms_norm_xla_forward and declared.fn_for("cpu") is declared.fn
    assert "forward: XLA's fusion" in declared.note_for("cuda")
