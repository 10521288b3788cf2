"""BF16/FP16 GEMM in AITER's "tn" convention: ``gemm(a, b) = a[..., K] @ b[N, K]^T``, float32 accumulation,
output in a's dtype.

Implementations, declared at the end of this module: ``aiter`` (ROCm, AITER's a16w16 ASM kernels) and ``xla``
(``jax_aiter.ref.gemm``: cuBLAS on NVIDIA, Eigen on the CPU). The gradient GEMMs are XLA's on every backend
(float32 accumulation, rounded once), the formulas JAX's autodiff of the reference gives. Forward, dgrad and
wgrad are custom-partitioned (``jax_aiter._partition``), because XLA cannot partition the opaque AITER kernel: the
weight is gathered for the forward and dgrad, and wgrad is reduced over the token axes (docs/mxfp4.md,
"Sharding"). Differentiation is reverse-mode (``custom_vjp``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_aiter import _backend, _checks
from jax_aiter._partition import LinearOp
from jax_aiter.aiter import GEMM_BF16
from jax_aiter.aiter import LIBRARY as AITER_LIBRARY
from jax_aiter.aiter import gemm as aiter_impl
from jax_aiter.ref import gemm as ref

__all__ = ["gemm"]


def gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    _checks.check_dtype("a", a, (jnp.bfloat16, jnp.float16))
    _checks.check_same_dtype("b", b, "a", a)
    a_shape = _checks.check_min_rank("a", a, 1)
    b_shape = _checks.check_rank("b", b, 2)
    if b_shape[1] != a_shape[-1]:
        raise ValueError(f"b must be [N, K] with K = a's last dimension {a_shape[-1]}, got shape {b_shape}")
    return _gemm(a, b)


def _fprop(_, split, a, b):
    return (_backend.dispatch("gemm", a, split.gather(b, n=0, k=1)),)


def _dgrad(_, split, g, b):
    b = split.gather(b, n=0, k=1)
    # 16-bit operands as they are: their products are exact in the float32 accumulator (an upcast operand would
    # turn the GEMM into a float32/TF32 one at half the rate or less).
    return (ref.dot_in_dtype(g.astype(b.dtype), b, (((g.ndim - 1,), (0,)), ((), ())), b.dtype),)


def _wgrad(_, split, g, a, b):
    # b contributes only its sharding, which is the one the weight gradient is reduced to.
    del b
    tokens = tuple(range(g.ndim - 1))
    dimension_numbers = ((tokens, tokens), ((), ()))
    g = g.astype(a.dtype)
    if split.splits_tokens():
        # float32 partial sums: they are reduced over the token shards before the one rounding to a's dtype.
        partial = lax.dot_general(g, a, dimension_numbers, preferred_element_type=jnp.float32)
        return (split.reduce_over_tokens(partial, n=0, k=1).astype(a.dtype),)
    # Whole sums on every device: the GEMM rounds them once itself, as dgrad's does, and no float32 weight-sized
    # result goes through memory (on an H200 that round trip cost a Llama-3-8B block's step 0.6 ms of GPU time).
    return (split.reduce_over_tokens(ref.dot_in_dtype(g, a, dimension_numbers, a.dtype), n=0, k=1),)


_FPROP = LinearOp(_fprop, operands=("... _", "n k"), results=("... _",))
_DGRAD = LinearOp(_dgrad, operands=("... _", "n k"), results=("... _",))
_WGRAD = LinearOp(_wgrad, operands=("... _", "... _", "n k"), results=("n k",))


@jax.custom_vjp
def _gemm(a, b):
    return _FPROP(None, a, b)[0]


def _fwd(a, b):
    return _gemm(a, b), (a, b)


def _bwd(residuals, g):
    a, b = residuals
    return _DGRAD(None, g, b)[0], _WGRAD(None, g, a, b)[0]


_gemm.defvjp(_fwd, _bwd)

# --- implementations ----------------------------------------------------------------------------------------

_backend.define_op(
    "gemm", example=lambda: ((jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16),
                              jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)), {}),
    implementations=(
        _backend.Implementation("aiter", aiter_impl.gemm, platforms=("rocm",), library=AITER_LIBRARY,
                                targets=(GEMM_BF16,), supports=aiter_impl.supports),
        _backend.Implementation("xla", ref.gemm),
    ))
