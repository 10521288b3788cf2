"""BF16/FP16 GEMM reference: ``a[..., K] @ b[N, K]^T`` with float32 accumulation, output in a's dtype."""

import jax
import jax.numpy as jnp
from jax import lax


def dot_in_dtype(x: jax.Array, y: jax.Array, dimension_numbers, dtype) -> jax.Array:
    """``lax.dot_general`` of 16-bit operands with float32 accumulation, rounded once to ``dtype``.

    On GPUs the product is asked for in ``dtype`` directly: cuBLAS / hipBLASLt accumulate 16-bit GEMMs in
    float32 (XLA's compute type for them) and round once in the epilogue, so no float32 result makes a round
    trip through memory. On the CPU it is computed in float32 and converted, as before."""

    def via_float32(x, y):
        return lax.dot_general(x, y, dimension_numbers, preferred_element_type=jnp.float32).astype(dtype)

    def direct(x, y):
        return lax.dot_general(x, y, dimension_numbers, preferred_element_type=dtype)

    return lax.platform_dependent(x, y, cpu=via_float32, default=direct)


def gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    return dot_in_dtype(a, b, (((a.ndim - 1,), (1,)), ((), ())), a.dtype)
