"""Argument checks shared by the public ops: they raise before anything is traced into XLA and name the
argument at fault."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp
import numpy as np

FLOAT_ACTIVATION_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def shape_dtype(name: str, value: Any) -> tuple[tuple[int, ...], np.dtype]:
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(value).__name__}")
    return tuple(value.shape), np.dtype(value.dtype)


def check_dtype(name: str, value: Any, allowed: Iterable[Any]) -> np.dtype:
    _, dtype = shape_dtype(name, value)
    allowed = tuple(np.dtype(a) for a in allowed)
    if dtype not in allowed:
        names = ", ".join(str(a) for a in allowed)
        raise TypeError(f"{name} must have dtype in ({names}), got {dtype}")
    return dtype


def check_min_rank(name: str, value: Any, rank: int) -> tuple[int, ...]:
    shape, _ = shape_dtype(name, value)
    if len(shape) < rank:
        raise ValueError(f"{name} must have rank >= {rank}, got shape {shape}")
    return shape


def check_rank(name: str, value: Any, rank: int) -> tuple[int, ...]:
    shape, _ = shape_dtype(name, value)
    if len(shape) != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {shape}")
    return shape


def check_same_dtype(name: str, value: Any, other_name: str, other: Any) -> None:
    shape_dtype(name, value)
    if np.dtype(value.dtype) != np.dtype(other.dtype):
        raise TypeError(f"{name} must have the dtype of {other_name} ({np.dtype(other.dtype)}), got {np.dtype(value.dtype)}")


def check_positive_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    value = float(value)
    if not value > 0 or not np.isfinite(value):
        raise ValueError(f"{name} must be a positive finite float, got {value}")
    return value


def check_epsilon(name: str, value: Any) -> float:
    """A positive float that float32 holds as a normal number: the kernels add it in float32, where a smaller one
    would be 0 (an all-zero row would then divide by zero)."""
    value = check_positive_float(name, value)
    if not np.finfo(np.float32).tiny <= value <= np.finfo(np.float32).max:
        raise ValueError(f"{name} must be a normal float32 number (between {np.finfo(np.float32).tiny:.3g} and "
                         f"{np.finfo(np.float32).max:.3g}), got {value}")
    return value
