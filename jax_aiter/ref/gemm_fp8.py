"""FP8 numerics of ``jax_aiter.gemm_fp8``: per-tensor current scaling, the cast to an OCP float8 format, and the
scaled product of two float8 operands (docs/fp8.md).

* Scale: ``scale = max(amax * (1 / fmax), 2^-126)`` in float32, where ``amax = max |x|`` over the whole tensor
  in this call, ``fmax`` is the format's largest finite value (448 for E4M3, 57344 for E5M2) and ``1 / fmax`` is
  rounded to float32 once. The floor is float32's smallest normal number: an all-zero tensor (whose codes are all
  0 whatever the scale) and a tensor of tiny values get a scale that no GPU flushes to zero. When amax is not
  finite (an inf or NaN anywhere) the scale is NaN, so every product the tensor enters is NaN: a per-tensor scale
  cannot isolate the bad element, and a NaN result is what an overflow check sees.
* Cast: ``q = float8(clip(x * (1 / scale), -fmax, fmax))``, the reciprocal and the product in float32 and the
  conversion rounding to nearest even. The element at amax becomes exactly +-fmax; the clip saturates what float32
  rounding may push past fmax, which E4M3 would turn into NaN and E5M2 into inf.
* Product: ``dot(qa, qb) * scale_ab`` with ``scale_ab = scale_a * scale_b``, accumulated in float32. Every
  float8 value is exact in bfloat16 and float32 and every product of two of them in float32, so implementations
  differ only in the order of the float32 sums.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

E4M3 = "float8_e4m3fn"
E5M2 = "float8_e5m2"
FORMATS = (E4M3, E5M2)
SMALLEST_SCALE = 2.0 ** -126


# The rule is written with reciprocals, multiplied: XLA turns a division by a scalar into exactly that (the
# reciprocal rounded once, then a product), so spelling it out makes the bytes the same on every backend.


def format_max(fmt: str) -> float:
    return float(jnp.finfo(fmt).max)


def current_scale(x: jax.Array, fmt: str) -> jax.Array:
    """The float32 scalar scale of ``x`` for format ``fmt`` (module docstring)."""
    amax = jnp.max(jnp.abs(x), initial=0).astype(jnp.float32)
    scale = jnp.maximum(amax * (np.float32(1) / np.float32(format_max(fmt))), np.float32(SMALLEST_SCALE))
    return jnp.where(jnp.isfinite(amax), scale, jnp.float32(jnp.nan))


def quantize(x: jax.Array, scale: jax.Array, fmt: str) -> jax.Array:
    """``x`` times ``1 / scale``, saturated to the format's finite range and rounded to ``fmt``."""
    fmax = format_max(fmt)
    return jnp.clip(x.astype(jnp.float32) * (1 / scale), -fmax, fmax).astype(fmt)


def _dimension_numbers(contracting: tuple[int, int]):
    return ((contracting[0],), (contracting[1],)), ((), ())


def scaled_dot(qa: jax.Array, qb: jax.Array, scale: jax.Array, *, contracting: tuple[int, int]) -> jax.Array:
    """The exact reference: float32 ``dot(qa, qb)`` over dimensions ``contracting`` of the 2-D operands, times
    ``scale``. The operands are upcast (exactly) and multiplied at HIGHEST precision, so the products are exact
    and only the float32 summation rounds."""
    acc = lax.dot_general(qa.astype(jnp.float32), qb.astype(jnp.float32), _dimension_numbers(contracting),
                          precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return acc * scale


def scaled_dot_fp8(qa: jax.Array, qb: jax.Array, scale: jax.Array, *, contracting: tuple[int, int]) -> jax.Array:
    """:func:`scaled_dot` as one dot of the float8 operands themselves, with float32 results, and the scalar scale
    applied to the result: the form XLA's GPU compiler rewrites to cuBLASLt's FP8 GEMM, with the scale multiply
    fused into it. HIGHEST precision keeps that GEMM off cuBLASLt's fast-accumulation mode (XLA enables it only at
    DEFAULT precision), which sums in less than float32 precision; where no FP8 GEMM serves the operands, XLA
    computes the dot in float16, exactly."""
    return lax.dot_general(qa, qb, _dimension_numbers(contracting), precision=lax.Precision.HIGHEST,
                           preferred_element_type=jnp.float32) * scale
