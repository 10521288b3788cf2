import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_aiter.gemm import gemm

import _oracle


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("a_shape, n", [((16, 64), 32), ((2, 3, 128), 8), ((1, 32), 1)])
def test_matches_float64(dtype, a_shape, n):
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, a_shape, jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (n, a_shape[-1]), jnp.float32).astype(dtype)
    out = jax.jit(gemm)(a, b)
    assert out.shape == (*a_shape[:-1], n) and out.dtype == dtype
    expected = _oracle.f64(a) @ _oracle.f64(b).T
    # fp32 accumulation then one rounding: error is the output rounding plus sqrt(K)-scaled fp32 noise.
    _oracle.assert_close(out, expected, dtype, scale=np.sqrt(a_shape[-1]))


def test_gradients_match_float64():
    ka, kb, kg = jax.random.split(jax.random.key(1), 3)
    a = jax.random.normal(ka, (8, 64), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(kb, (16, 64), jnp.float32).astype(jnp.bfloat16)
    g = jax.random.normal(kg, (8, 16), jnp.float32).astype(jnp.bfloat16)
    _, vjp = jax.vjp(gemm, a, b)
    da, db = vjp(g)
    _oracle.assert_close(da, _oracle.f64(g) @ _oracle.f64(b), jnp.bfloat16, scale=4.0)
    _oracle.assert_close(db, _oracle.f64(g).T @ _oracle.f64(a), jnp.bfloat16, scale=4.0)


def test_vmap():
    a = jax.random.normal(jax.random.key(2), (4, 5, 32), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.key(3), (4, 6, 32), jnp.float32).astype(jnp.bfloat16)
    out = jax.vmap(gemm)(a, b)
    expected = np.einsum("bmk,bnk->bmn", _oracle.f64(a), _oracle.f64(b))
    _oracle.assert_close(out, expected, jnp.bfloat16, scale=np.sqrt(32))


@pytest.mark.parametrize("a, b, error, match", [
    (jnp.ones((4, 8), jnp.float32), jnp.ones((2, 8), jnp.float32), TypeError, "a must have dtype"),
    (jnp.ones((4, 8), jnp.bfloat16), jnp.ones((2, 8), jnp.float16), TypeError, "b must have the dtype of a"),
    (jnp.ones((4, 8), jnp.bfloat16), jnp.ones((2, 7), jnp.bfloat16), ValueError, "b must be"),
    (jnp.ones((4, 8), jnp.bfloat16), jnp.ones((2, 1, 8), jnp.bfloat16), ValueError, "b must have rank 2"),
])
def test_bad_input(a, b, error, match):
    with pytest.raises(error, match=match):
        gemm(a, b)


def test_weight_that_is_not_an_array_is_named():
    with pytest.raises(TypeError, match="b must be an array, got list"):
        gemm(jnp.ones((2, 8), jnp.bfloat16), [[1.0] * 8] * 4)
