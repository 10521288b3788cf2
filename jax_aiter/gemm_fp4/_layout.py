"""AITER operand layouts (docs/mxfp4.md): the (16, 16) data shuffle and the zero-padded scale shuffle."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_aiter import _checks
from jax_aiter.ref import mxfp4 as ref

__all__ = ["shuffle_fp4", "shuffle_scales", "unshuffle_fp4", "unshuffle_scales"]

_shuffle_fp4 = jax.jit(ref.shuffle_fp4)
_unshuffle_fp4 = jax.jit(ref.unshuffle_fp4)
_shuffle_scales = jax.jit(ref.shuffle_scales)
_unshuffle_scales = jax.jit(ref.unshuffle_scales, static_argnames="shape")


def _check_packed(name: str, data: jax.Array) -> tuple[int, int]:
    _checks.check_dtype(name, data, (jnp.uint8,))
    rows, cols = _checks.check_rank(name, data, 2)
    if rows % 16 or cols % 32:
        raise ValueError(f"{name}: the shuffled layout needs [R, C] bytes with R % 16 == 0 and C % 32 == 0, "
                         f"got {[rows, cols]}")
    return rows, cols


def shuffle_fp4(data: jax.Array) -> jax.Array:
    """Packed fp4x2 bytes [R, C] (R % 16 == 0, C % 32 == 0) -> AITER's shuffled B-operand layout, same shape."""
    _check_packed("data", data)
    return _shuffle_fp4(data)


def unshuffle_fp4(data: jax.Array) -> jax.Array:
    """Inverse of :func:`shuffle_fp4`."""
    _check_packed("data", data)
    return _unshuffle_fp4(data)


def shuffle_scales(scales: jax.Array) -> jax.Array:
    """Scale bytes [R, S] -> zero-padded to (ceil(R/256)*256, ceil(S/8)*8) and shuffled for AITER's GEMM."""
    _checks.check_dtype("scales", scales, (jnp.uint8,))
    _checks.check_rank("scales", scales, 2)
    return _shuffle_scales(scales)


def unshuffle_scales(scales: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """Inverse of :func:`shuffle_scales`: ``shape`` is the unpadded [R, S] to cut the padding back to."""
    _checks.check_dtype("scales", scales, (jnp.uint8,))
    padded = _checks.check_rank("scales", scales, 2)
    if (not isinstance(shape, (tuple, list)) or len(shape) != 2
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape)):
        raise TypeError(f"shape must be two non-negative ints (rows, scale columns), got {shape!r}")
    shape = (shape[0], shape[1])
    if padded != ref.padded_scale_shape(*shape):
        raise ValueError(f"scales has shape {padded}, but shuffled scales of {shape} have shape "
                         f"{ref.padded_scale_shape(*shape)}")
    return _unshuffle_scales(scales, shape=shape)
