"""RMSNorm reference: float32 math, output in the input's dtype."""

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, gamma: jax.Array, *, epsilon: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + epsilon)
    return (x32 * inv_rms * gamma.astype(jnp.float32)).astype(x.dtype)


def rms_norm_with_add(x: jax.Array, residual: jax.Array, gamma: jax.Array, *, epsilon: float):
    # The sum is rounded to x's dtype once; the norm reads that rounded sum, as a fused kernel that writes
    # the residual stream and normalizes it would.
    total = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
    return rms_norm(total, gamma, epsilon=epsilon), total
