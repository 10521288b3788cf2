"""SiLU-and-mul reference: ``x = [gate | up]`` along the last axis, float32 math."""

import jax
import jax.numpy as jnp


def silu_and_mul(x: jax.Array) -> jax.Array:
    gate, up = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(gate) * up).astype(x.dtype)
