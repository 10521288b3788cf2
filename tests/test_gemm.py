import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_aiter.gemm import gemm

import _oracle


def assert_float32_accumulated(out, subscripts, a, b):
    """out = einsum(subscripts, a, b) accumulated in float32 and rounded once to out's dtype. The 16-bit products
    are exact in float32 and the K - 1 additions, in any order, err by at most (K - 1) 2^-24 sum|a_k b_k|, so
    |out - exact| <= u |exact| + K 2^-24 sum|a_k b_k| (u: half the dtype's ulp, 2^-8 bf16, 2^-11 f16; the
    (1 + u) on the sum's error fits in K vs K - 1), plus half a subnormal spacing where out is subnormal."""
    a, b = _oracle.f64(a), _oracle.f64(b)
    exact = np.einsum(subscripts, a, b)
    terms = np.einsum(subscripts, np.ones_like(a), np.ones_like(b))
    info = ml_dtypes.finfo(out.dtype)
    bound = (float(info.eps) / 2 * np.abs(exact) + terms * 2.0 ** -24 * np.einsum(subscripts, np.abs(a), np.abs(b))
             + float(info.smallest_subnormal) / 2)
    err = np.abs(_oracle.f64(out) - exact)
    assert np.all(err <= bound), float(np.max(err / bound))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("a_shape, n", [((16, 64), 32), ((2, 3, 128), 8), ((1, 32), 1)])
def test_matches_float64(dtype, a_shape, n):
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, a_shape, jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (n, a_shape[-1]), jnp.float32).astype(dtype)
    out = jax.jit(gemm)(a, b)
    assert out.shape == (*a_shape[:-1], n) and out.dtype == dtype
    assert_float32_accumulated(out, "...k,nk->...n", a, b)


def test_gradients_match_float64():
    ka, kb, kg = jax.random.split(jax.random.key(1), 3)
    a = jax.random.normal(ka, (8, 64), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(kb, (16, 64), jnp.float32).astype(jnp.bfloat16)
    g = jax.random.normal(kg, (8, 16), jnp.float32).astype(jnp.bfloat16)
    _, vjp = jax.vjp(gemm, a, b)
    da, db = vjp(g)
    assert_float32_accumulated(da, "mn,nk->mk", g, b)
    assert_float32_accumulated(db, "mn,mk->nk", g, a)


@pytest.mark.gpu
def test_gpu_gradients_match_float64():
    """On the GPU, where the gradient GEMMs round their float32 sums into bf16 themselves; the weight gradient
    sums over 4096 tokens."""
    gpu = jax.devices("gpu")[0]
    ka, kb, kg = jax.random.split(jax.random.key(4), 3)
    a, b, g = (jax.device_put(jax.random.normal(key, shape, jnp.float32).astype(jnp.bfloat16), gpu)
               for key, shape in ((ka, (4096, 256)), (kb, (128, 256)), (kg, (4096, 128))))
    da, db = jax.jit(lambda a, b, g: jax.vjp(gemm, a, b)[1](g))(a, b, g)
    assert da.devices() == {gpu}
    assert_float32_accumulated(da, "mn,nk->mk", g, b)
    assert_float32_accumulated(db, "mn,mk->nk", g, a)


def test_gpu_programs_take_every_gemm_result_in_bf16():
    """Lowered for CUDA, the forward and both gradient GEMMs return bf16 (the GEMM rounds its float32 sums once):
    no float32 result the size of the weight is written and converted. Only partial sums over sharded tokens stay
    float32 (test_sharding.py)."""
    a = jax.ShapeDtypeStruct((4096, 256), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
    g = jax.ShapeDtypeStruct((4096, 128), jnp.bfloat16)

    def step(a, b, g):
        out, vjp = jax.vjp(gemm, a, b)
        return out, vjp(g)

    text = jax.jit(step).trace(a, b, g).lower(lowering_platforms=("cuda",)).as_text()
    results = re.findall(r"stablehlo\.dot_general .*-> tensor<([0-9x]+)x(\w+)>", text)
    assert sorted(results) == [("128x256", "bf16"), ("4096x128", "bf16"), ("4096x256", "bf16")], results


def test_vmap():
    a = jax.random.normal(jax.random.key(2), (4, 5, 32), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(jax.random.key(3), (4, 6, 32), jnp.float32).astype(jnp.bfloat16)
    out = jax.vmap(gemm)(a, b)
    assert_float32_accumulated(out, "bmk,bnk->bmn", a, b)


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
