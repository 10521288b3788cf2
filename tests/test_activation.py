import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
    _oracle.assert_close(out, _oracle.silu_and_mul(x), dtype, factor=2)


def test_known_values(impl):
    # silu(0) = 0, silu(ln 3)= ln3 * 3/4; the up half scales the result.
    x = jnp.array([[0.0, np.log(3.0), 5.0, 2.0]], jnp.float32)
    with jax_aiter.use_backend(silu_and_mul=impl):
        out = silu_and_mul(x)
    np.testing.assert_allclose(np.asarray(out), [[0.0, np.log(3.0) * 0.75 * 2.0]], rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradient_matches_hand_derived(impl, dtype):
    x = (2 * jax.random.normal(jax.random.key(2), (6, 40), jnp.float32)).astype(dtype)
    dout = jax.random.normal(jax.random.key(3), (6, 20), jnp.float32).astype(dtype)
    with jax_aiter.use_backend(silu_and_mul=impl):
        _, vjp = jax.vjp(silu_and_mul, x)
        (dx,) = vjp(dout)
    assert dx.dtype == dtype
    _oracle.assert_close(dx, _oracle.silu_and_mul_grad(x, dout), dtype, factor=3)


def test_oracle_gradient_against_finite_differences():
    rng = np.random.default_rng(1)
    x, dout = rng.normal(size=(2, 8)), rng.normal(size=(2, 4))
    np.testing.assert_allclose(_oracle.silu_and_mul_grad(x, dout),
                               _oracle.central_difference(lambda v: np.sum(_oracle.silu_and_mul(v) * dout), x),
                               rtol=1e-6, atol=1e-8)


def test_vmap_and_grad_under_jit(impl):
    x = jax.random.normal(jax.random.key(4), (3, 5, 16), jnp.float32)
    with jax_aiter.use_backend(silu_and_mul=impl):
        out = jax.jit(jax.vmap(silu_and_mul))(x)
        g = jax.jit(jax.grad(lambda v: jnp.sum(silu_and_mul(v) ** 2)))(x)
    _oracle.assert_close(out, _oracle.silu_and_mul(x), jnp.float32)
    want = _oracle.silu_and_mul_grad(x, 2 * _oracle.silu_and_mul(x))
    _oracle.assert_close(g, want, jnp.float32, factor=3)


@pytest.mark.parametrize("x, error, match", [
    (jnp.ones((2, 3)), ValueError, "must be even"),
    (jnp.ones((2, 4), jnp.int8), TypeError, "x must have dtype"),
    (jnp.ones(()), ValueError, "rank >= 1"),
])
def test_bad_input(x, error, match):
    with pytest.raises(error, match=match):
        silu_and_mul(x)
