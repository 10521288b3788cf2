"""RMSNorm reference: float32 math, output in the input's dtype, exact for every finite input.

``y = x * rsqrt(mean(x^2) + epsilon) * gamma``. A float32 square overflows from |x| = 2^64, and a row's sum of
squares sooner; bfloat16 and float32 rows reach that. A row whose plain sum of squares is not finite is summed
again with its elements scaled by 2^-80 (and epsilon by 2^-160), a power of two, so the scaling itself is
exact: (2^128 * 2^-80)^2 times 2^31 elements stays finite. Such a row has an element above 2^48; the squares the
scaling pushes below float32's normal range are those of elements under 2^17, together less than 2^-32 of the
sum. Rows whose plain sum is finite (every ordinary row) are computed exactly as without the scaling.

The derivative is written out (custom VJP) in the form that stays finite wherever the gradient is: with
``n = x / rms``, ``dx = (gamma * dy - n * mean(gamma * dy * n)) / rms`` and ``dgamma`` the sum over rows of
``dy * n``. JAX's own derivative passes through ``1/rms^3``, which overflows for rows far below
``sqrt(epsilon)`` when epsilon is tiny, and underflows for huge rows.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

OVERFLOW_SCALE = 2.0 ** -80
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _row_scale(x32: jax.Array, epsilon: float) -> tuple[jax.Array, jax.Array]:
    """Per row (last axis kept): ``scale`` (1 or 2^-80) and ``u = (mean(x^2) + epsilon) * scale^2``, finite for
    finite x, so that ``rsqrt(mean(x^2) + epsilon) = rsqrt(u) * scale``."""
    plain = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    finite = jnp.isfinite(plain)
    scale = jnp.where(finite, 1.0, OVERFLOW_SCALE).astype(jnp.float32)
    # The per-row scale is a runtime value, so XLA cannot rewrite (x*s)*(x*s) as (x*x)*(s*s) with s*s folded to
    # 2^-160 = 0 in float32 (which turns an overflowing row into inf*0 = NaN; jaxlib 0.11's CPU compiler does that
    # for a constant s), and the scaled sum needs no materialized copy of x.
    scaled_x = x32 * scale
    scaled = jnp.mean(scaled_x * scaled_x, axis=-1, keepdims=True)
    u = jnp.where(finite, plain + epsilon, scaled + epsilon * OVERFLOW_SCALE * OVERFLOW_SCALE)
    return scale, u


def row_rms(x: jax.Array, *, epsilon: float) -> jax.Array:
    """``sqrt(mean(x^2) + epsilon)`` per row, float32, without the last axis. Finite and normal for finite x:
    at least sqrt(epsilon) >= 2^-63, at most float32's largest value (the rounding of a row of them may not
    carry it past)."""
    scale, u = _row_scale(x.astype(jnp.float32), epsilon)
    rms = jnp.sqrt(u) / scale
    return jnp.where(jnp.isfinite(u), jnp.minimum(rms, _FLOAT32_MAX), rms)[..., 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_norm(x, gamma, epsilon):
    return _rms_norm_forward(x, gamma, epsilon)[0]


def _rms_norm_forward(x, gamma, epsilon):
    x32 = x.astype(jnp.float32)
    scale, u = _row_scale(x32, epsilon)
    inv_scaled_rms = jax.lax.rsqrt(u)
    y = (x32 * scale * inv_scaled_rms * gamma.astype(jnp.float32)).astype(x.dtype)
    return y, (x, gamma, scale, inv_scaled_rms)


def _rms_norm_backward(epsilon, residuals, dy):
    del epsilon  # in inv_scaled_rms
    x, gamma, scale, inv_scaled_rms = residuals
    normalized = x.astype(jnp.float32) * scale * inv_scaled_rms
    weighted = dy.astype(jnp.float32) * gamma.astype(jnp.float32)
    mean_dot = jnp.mean(weighted * normalized, axis=-1, keepdims=True)
    dx = (weighted - normalized * mean_dot) * inv_scaled_rms * scale
    dgamma = jnp.sum(dy.astype(jnp.float32) * normalized, axis=tuple(range(x.ndim - 1)))
    return dx.astype(x.dtype), dgamma.astype(gamma.dtype)


_rms_norm.defvjp(_rms_norm_forward, _rms_norm_backward)


def rms_norm(x: jax.Array, gamma: jax.Array, *, epsilon: float) -> jax.Array:
    return _rms_norm(x, gamma, epsilon)


def rms_norm_with_add(x: jax.Array, residual: jax.Array, gamma: jax.Array, *, epsilon: float):
    # The sum is rounded to x's dtype once; the norm reads that rounded sum, as a fused kernel that writes
    # the residual stream and normalizes it would.
    total = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
    return rms_norm(total, gamma, epsilon=epsilon), total
