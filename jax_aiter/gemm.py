"""BF16/FP16 GEMM in AITER's "tn" convention: ``gemm(a, b) = a[..., K] @ b[N, K]^T``, float32 accumulation,
output in a's dtype.

Implementations: ``xla`` (``jax_aiter.ref.gemm``: cuBLAS on NVIDIA, Eigen on the CPU, differentiated by JAX);
the AITER ASM kernel on ROCm registers itself from ``jax_aiter.aiter``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_aiter import _backend, _checks
from jax_aiter.ref import gemm as ref

__all__ = ["gemm"]


def gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    _checks.check_dtype("a", a, (jnp.bfloat16, jnp.float16))
    _checks.check_same_dtype("b", b, "a", a)
    a_shape = _checks.check_min_rank("a", a, 1)
    b_shape = _checks.check_rank("b", b, 2)
    if b_shape[1] != a_shape[-1]:
        raise ValueError(f"b must be [N, K] with K = a's last dimension {a_shape[-1]}, got shape {b_shape}")
    return _backend.dispatch("gemm", a, b)


_backend.define_op("gemm", example=lambda: ((jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16),
                                             jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)), {}))
_backend.register("gemm", "xla", ref.gemm)

import jax_aiter.aiter.gemm  # noqa: E402,F401  (registers the ROCm implementation)
