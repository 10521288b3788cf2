"""BF16/FP16 GEMM reference: ``a[..., K] @ b[N, K]^T`` with float32 accumulation, output in a's dtype."""

import jax
import jax.numpy as jnp


def gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    out = jax.lax.dot_general(a, b, (((a.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return out.astype(a.dtype)
