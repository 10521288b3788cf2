"""FP8 numerics of ``jax_aiter.gemm_fp8``: per-tensor current scaling with power-of-two scales, the cast to an OCP
float8 format, and the scaled product of two float8 operands (docs/fp8.md).

* Scale: the smallest power of two ``scale >= 2^-126`` with ``amax <= fmax * scale``, where ``amax = max |x|``
  over the whole tensor in this call and ``fmax`` is the format's largest finite value (448 for E4M3, 57344 for
  E5M2). So ``amax / scale`` lies in ``(fmax / 2, fmax]`` (the floor aside): at most one binade of the format's
  range goes unused. The floor is float32's smallest normal number: an all-zero tensor (whose codes are all 0
  whatever the scale) and a tensor of tiny values get a scale that no GPU flushes to zero. When amax is not finite
  (an inf or NaN anywhere) the scale is NaN, so every product the tensor enters is NaN: a per-tensor scale cannot
  isolate the bad element, and a NaN result is what an overflow check sees.
* Cast: ``q = float8(clip(x * (1 / scale), -fmax, fmax))``, rounding to nearest even. ``1 / scale`` and the
  product are exact in float32 (powers of two), so the conversion is the only rounding; no element exceeds fmax,
  and the clip keeps :func:`quantize` safe for a scale of any other origin (E4M3 would turn an overflow into NaN,
  E5M2 into inf).
* Product: ``dot(qa, qb) * scale_ab`` with ``scale_ab = scale_a * scale_b``, accumulated in float32 and rounded to
  the output dtype. Every float8 value is exact in bfloat16 and float32, every product of two of them in
  float32, and scale_ab is a power of two (exact down to 2^-149), so the rescale is exact too and implementations
  differ only in the order of the float32 sums. Because scale_ab is a power of two, a bfloat16 result times it is
  exact too (bfloat16's subnormal range aside): the form GPUs get (:func:`scaled_dot_fp8`).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

E4M3 = "float8_e4m3fn"
E5M2 = "float8_e5m2"
FORMATS = (E4M3, E5M2)
SMALLEST_SCALE = 2.0 ** -126


def format_max(fmt: str) -> float:
    return float(jnp.finfo(fmt).max)


def current_scale(x: jax.Array, fmt: str) -> jax.Array:
    """The float32 scalar scale of ``x`` for format ``fmt`` (module docstring)."""
    amax = jnp.max(jnp.abs(x), initial=0).astype(jnp.float32)
    fmax = np.float32(format_max(fmt))
    # 2^(e_amax - e_fmax) from the binary exponents brings amax within a factor 2 of fmax; one binade more where
    # it still exceeds fmax. Exact for every normal amax; below fmax * 2^-126 the floor applies.
    scale = jnp.ldexp(np.float32(1), jnp.frexp(amax)[1] - np.frexp(fmax)[1])
    scale = jnp.where(amax > fmax * scale, 2 * scale, scale)
    scale = jnp.where(amax > fmax * np.float32(SMALLEST_SCALE), scale, np.float32(SMALLEST_SCALE))
    return jnp.where(jnp.isfinite(amax), scale, jnp.float32(jnp.nan))


def quantize(x: jax.Array, scale: jax.Array, fmt: str) -> jax.Array:
    """``x`` times ``1 / scale``, saturated to the format's finite range and rounded to ``fmt``."""
    fmax = format_max(fmt)
    return jnp.clip(x.astype(jnp.float32) * (1 / scale), -fmax, fmax).astype(fmt)


def _dimension_numbers(contracting: tuple[int, int]):
    return ((contracting[0],), (contracting[1],)), ((), ())


def scaled_dot(qa: jax.Array, qb: jax.Array, scale: jax.Array, *, contracting: tuple[int, int],
               out_dtype: np.dtype) -> jax.Array:
    """The exact reference: float32 ``dot(qa, qb)`` over dimensions ``contracting`` of the 2-D operands, times
    ``scale``, rounded to ``out_dtype``. The operands are upcast (exactly) and multiplied at HIGHEST precision,
    so the products are exact and only the float32 summation rounds."""
    acc = lax.dot_general(qa.astype(jnp.float32), qb.astype(jnp.float32), _dimension_numbers(contracting),
                          precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return (acc * scale).astype(out_dtype)


def scaled_dot_fp8(qa: jax.Array, qb: jax.Array, scale: jax.Array, *, contracting: tuple[int, int],
                   out_dtype: np.dtype) -> jax.Array:
    """:func:`scaled_dot` in the form XLA's GPU compilers rewrite to one FP8 GEMM that applies the scale and writes
    the output dtype itself: a dot of the float8 operands with results in bfloat16 (for bfloat16 outputs; float32
    otherwise), times the scale in that dtype. The rewrite folds a scalar multiply of an FP8 GEMM's result into
    the GEMM's scale factor, so the GEMM sums the exact products in float32, multiplies by the scale and rounds
    once: no float32 result is written and read back. Where XLA computes the program as written instead (no FP8
    GEMM for the operands), the dot rounds to bfloat16 before the multiply; the scale is a power of two, so the
    multiply is exact and the value the same, bfloat16's subnormal range aside. HIGHEST precision keeps the GEMM
    off cuBLASLt's fast-accumulation mode (XLA enables it only at DEFAULT precision), which sums in less than
    float32 precision."""
    # float16 cannot hold every power-of-two scale: float16 outputs are rounded from float32 results, as in
    # scaled_dot.
    result = jnp.bfloat16 if np.dtype(out_dtype) == jnp.bfloat16 else jnp.float32
    y = lax.dot_general(qa, qb, _dimension_numbers(contracting), precision=lax.Precision.HIGHEST,
                        preferred_element_type=result)
    return (y * scale.astype(result)).astype(out_dtype)
