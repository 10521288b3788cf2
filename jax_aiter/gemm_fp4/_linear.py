"""``gemm_fp4_bf16``: a linear layer ``y = a . b^T`` with MXFP4 GEMMs in the forward and both backward passes.

Each tensor is cast once: x and W by a dual cast in the forward pass (the columnwise copies are the residuals
for the backward pass, smaller than the bf16 tensors), g by a dual cast in the backward pass. Without
differentiation only the rowwise copies of x and W are made. All GEMMs go through the public ``gemm_fp4`` and
all casts through the public cast ops, so native kernels are picked up by backend dispatch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _checks
from jax_aiter.gemm_fp4 import _quantize
from jax_aiter.gemm_fp4._gemm import gemm_fp4
from jax_aiter.gemm_fp4.recipe import Mxfp4Recipe
from jax_aiter.gemm_fp4.tensor import MXFP4Quantizer, Mxfp4Tensor

__all__ = ["gemm_fp4_bf16", "role_sr_key"]

# Token rows are zero-padded to this multiple: wgrad contracts over them, and its shuffled B operand (x^T)
# needs a contraction length that is a multiple of 64. Zero rows add nothing to any product.
TOKEN_MULTIPLE = 64
_ROLE_INDEX = {"activation": 0, "weight": 1, "gradient": 2}


def role_sr_key(key_words: jax.Array, role: str) -> jax.Array:
    """The stochastic-rounding words of one role: threefry ``fold_in`` of the call's key with the role's index
    (activation 0, weight 1, gradient 2), then two words of ``jax.random.bits``."""
    key = jax.random.wrap_key_data(key_words, impl="threefry2x32")
    return jax.random.bits(jax.random.fold_in(key, _ROLE_INDEX[role]), (2,), jnp.uint32)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _PrimalDtypes:
    a: np.dtype
    b: np.dtype


def _token_matrix(t: jax.Array) -> tuple[jax.Array, int]:
    rows = math.prod(t.shape[:-1])
    matrix = t.reshape(rows, t.shape[-1])
    padded = -(-rows // TOKEN_MULTIPLE) * TOKEN_MULTIPLE
    return (jnp.pad(matrix, ((0, padded - rows), (0, 0))) if padded != rows else matrix), rows


def _quantize_role(t: jax.Array, role: str, recipe: Mxfp4Recipe, key_words: jax.Array, *, both: bool):
    quantizer = MXFP4Quantizer.for_role(role, recipe)
    if not both:
        quantizer = dataclasses.replace(quantizer, columnwise_layout=None)
    sr_key = role_sr_key(key_words, role) if recipe.stochastic(role) else None
    return quantizer.quantize(t, sr_key=sr_key)


def _gemm(a: Mxfp4Tensor, b: Mxfp4Tensor) -> jax.Array:
    return gemm_fp4(a.data, b.data, a.scales, b.scales)


def _forward(a, b, key_words, recipe, *, keep_residuals):
    x, rows = _token_matrix(a)
    act = _quantize_role(x, "activation", recipe, key_words, both=keep_residuals)
    weight = _quantize_role(b, "weight", recipe, key_words, both=keep_residuals)
    y = _gemm(act.rowwise, weight.rowwise)[:rows].reshape(*a.shape[:-1], b.shape[0])
    return y, (act.columnwise, weight.columnwise, key_words, _PrimalDtypes(a.dtype, b.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gemm_fp4_bf16(a, b, key_words, recipe):
    return _forward(a, b, key_words, recipe, keep_residuals=False)[0]


def _fwd(a, b, key_words, recipe):
    return _forward(a, b, key_words, recipe, keep_residuals=True)


def _bwd(recipe, residuals, dy):
    x_columnwise, w_columnwise, key_words, dtypes = residuals
    g, rows = _token_matrix(dy)
    grad = _quantize_role(g, "gradient", recipe, key_words, both=True)
    dx = _gemm(grad.rowwise, w_columnwise)[:rows].reshape(*dy.shape[:-1], w_columnwise.shape[-1])
    dw = _gemm(grad.columnwise, x_columnwise)
    return dx.astype(dtypes.a), dw.astype(dtypes.b), np.zeros(key_words.shape, jax.dtypes.float0)


_gemm_fp4_bf16.defvjp(_fwd, _bwd)


def gemm_fp4_bf16(a: jax.Array, b: jax.Array, recipe: Mxfp4Recipe | None = None, *, key: Any = None) -> jax.Array:
    """bf16 ``a[..., K] . b[N, K]^T`` with MXFP4 fprop, dgrad and wgrad as ``recipe`` says (default
    ``Mxfp4Recipe.default()``).

    ``a`` and ``b`` are bf16, fp16 or fp32; K and N must be multiples of 64, the token count is free (rows are
    zero-padded internally). Gradients come back in the input dtypes, computed from bf16 GEMM outputs.
    ``key`` (int seed, typed ``jax.random`` key or uint32[2]) is required when the recipe uses stochastic
    rounding and unused otherwise; pass a fresh key every step, or every step rounds alike.
    """
    recipe = Mxfp4Recipe.default() if recipe is None else recipe
    if not isinstance(recipe, Mxfp4Recipe):
        raise TypeError(f"recipe must be an Mxfp4Recipe, got {type(recipe).__name__}")
    _checks.check_dtype("a", a, _quantize.INPUT_DTYPES)
    _checks.check_dtype("b", b, _quantize.INPUT_DTYPES)
    a_shape = _checks.check_min_rank("a", a, 1)
    n, k = _checks.check_rank("b", b, 2)
    if k != a_shape[-1]:
        raise ValueError(f"b must be [N, K] with K = a's last dimension {a_shape[-1]}, got shape {(n, k)}")
    if k % 64 or n % 64:
        raise ValueError(f"b: N = {n} and K = {k} must be multiples of 64 (each is the contraction axis of a "
                         "backward GEMM whose shuffled B operand needs it)")
    if recipe.uses_stochastic_rounding:
        if key is None:
            raise ValueError("key: the recipe uses stochastic rounding; pass a jax.random key (a fresh one per step)")
        key_words = _quantize.key_words(key, "key")
    else:
        key_words = jnp.zeros(2, jnp.uint32)
    return _gemm_fp4_bf16(a, b, key_words, recipe)
