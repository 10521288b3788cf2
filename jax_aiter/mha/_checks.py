"""Argument checks for the attention functions. They run on shapes, dtypes and Python values before anything
is traced, and raise ValueError (bad value or shape) or TypeError (bad type or dtype) naming the argument."""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _checks as core

QKV_DTYPES = core.FLOAT_ACTIVATION_DTYPES
BIAS_DTYPES = core.FLOAT_ACTIVATION_DTYPES


def check_qkv(q: Any, k: Any, v: Any, *, rank: int) -> None:
    """Ranks, one shared dtype, and shapes that agree (batch/tokens, heads, head dims, Hq % Hk == 0)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        core.check_rank(name, x, rank)
    core.check_dtype("q", q, QKV_DTYPES)
    core.check_same_dtype("k", k, "q", q)
    core.check_same_dtype("v", v, "q", q)
    # Leading axes: [B, S] for the dense layout, [T] for the packed one; then heads, head dim.
    lead = rank - 2
    if lead == 2 and k.shape[0] != q.shape[0]:
        raise ValueError(f"k must have q's batch size {q.shape[0]}, got shape {k.shape}")
    if v.shape[:lead] != k.shape[:lead]:
        raise ValueError(f"v must have k's leading dimensions {k.shape[:lead]}, got shape {v.shape}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v must have k's number of heads {k.shape[-2]}, got shape {v.shape}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have q's head dimension {q.shape[-1]}, got shape {k.shape}")
    if q.shape[-1] == 0:
        raise ValueError(f"q's head dimension must be at least 1, got shape {q.shape}")
    q_heads, kv_heads = q.shape[-2], k.shape[-2]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"q's head count ({q_heads}) must be a multiple of k's ({kv_heads}) for MQA/GQA; "
                         f"got q shape {q.shape}, k shape {k.shape}")


def check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a Python bool, got {type(value).__name__}")
    return bool(value)


def check_static_int(name: str, value: Any, *, minimum: int | None) -> int:
    """A Python int known when tracing (it decides shapes or kernel launch grids, so it cannot be traced)."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be a static Python int, got {_describe(value)}")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a static Python int, got {_describe(value)}") from None
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    return result


def check_softmax_scale(softmax_scale: Any, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    return core.check_positive_float("softmax_scale", softmax_scale)


def check_softcap(softcap: Any) -> float:
    """0 (no soft-capping) or a positive finite float."""
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating)):
        raise TypeError(f"softcap must be a static Python float, got {_describe(softcap)}")
    softcap = float(softcap)
    if not (softcap >= 0 and math.isfinite(softcap)):
        raise ValueError(f"softcap must be 0 (off) or a positive finite float, got {softcap}")
    return softcap


def check_window(window_size: Any, causal: bool, span: int) -> tuple[int, int]:
    """``(left, right)`` in canonical form: −1 for an unbounded side. As in flash-attn, any negative side is
    unbounded and ``causal=True`` folds the window to ``(left, 0)``. A side of ``span`` (Sq + Sk, or the two
    maximum sequence lengths) or more bounds nothing either, so it becomes −1 too: no position arithmetic can
    overflow, whatever int is given."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) of ints, got {window_size!r}")
    left, right = (check_static_int("window_size", w, minimum=None) for w in window_size)
    if causal:
        right = 0
    return tuple(-1 if side < 0 or side >= span else side for side in (left, right))


def check_dropout(dropout_p: Any, dropout_key: Any) -> float:
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, (int, float, np.integer, np.floating)):
        raise TypeError(f"dropout_p must be a static Python float, got {_describe(dropout_p)}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p > 0:
        if dropout_key is None:
            raise ValueError("dropout_key is required when dropout_p > 0 (a jax.random.key or a raw uint32[2] key)")
        if not hasattr(dropout_key, "shape") or not hasattr(dropout_key, "dtype"):
            raise TypeError(f"dropout_key must be a PRNG key array, got {type(dropout_key).__name__}")
        shape, dtype = tuple(dropout_key.shape), dropout_key.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            if shape != ():
                raise ValueError(f"dropout_key must be a single key (shape ()), got shape {shape}")
        elif dtype != np.uint32 or shape != (2,):
            raise TypeError(f"dropout_key must be a typed key from jax.random.key or a raw uint32[2] key, "
                            f"got {dtype}{list(shape)}")
    return dropout_p


def check_bias(bias: Any, target: tuple[int, ...], target_names: str) -> tuple[int, ...]:
    """Numpy-style broadcastable to ``target``; returns the shape with leading 1s up to the target's rank."""
    shape, _ = core.shape_dtype("bias", bias)
    core.check_dtype("bias", bias, BIAS_DTYPES)
    if len(shape) > len(target) or any(s not in (1, t) for s, t in zip(shape[::-1], target[::-1])):
        raise ValueError(f"bias of shape {shape} is not broadcastable to {target_names} = {target}")
    return (1,) * (len(target) - len(shape)) + shape


def check_alibi_slopes(alibi_slopes: Any, batch: int, heads: int) -> None:
    shape, _ = core.shape_dtype("alibi_slopes", alibi_slopes)
    core.check_dtype("alibi_slopes", alibi_slopes, (jnp.float32,))
    if shape not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must have shape [Hq] = ({heads},) or [B, Hq] = ({batch}, {heads}), "
                         f"got {shape}")


def check_cu_seqlens(cu_seqlens_q: Any, cu_seqlens_k: Any) -> int:
    """int32 ``[B+1]`` offsets, one per layout; returns B."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        core.check_rank(name, cu, 1)
        core.check_dtype(name, cu, (jnp.int32,))
        if cu.shape[0] < 2:
            raise ValueError(f"{name} must hold B+1 >= 2 offsets, got shape {cu.shape}")
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(f"cu_seqlens_k must have cu_seqlens_q's shape {cu_seqlens_q.shape}, "
                         f"got {cu_seqlens_k.shape}")
    return cu_seqlens_q.shape[0] - 1


def check_cu_seqlens_values(name: str, cu: Any, total: int, max_seqlen: int, max_name: str) -> None:
    """Value checks where the offsets are known now; traced offsets are the caller's responsibility."""
    if isinstance(cu, jax.core.Tracer) or not isinstance(cu, (np.ndarray, jax.Array)):
        return
    offsets = np.asarray(cu)
    lengths = np.diff(offsets)
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets.tolist()}")
    if (lengths < 0).any():
        raise ValueError(f"{name} must be sorted (nondecreasing), got {offsets.tolist()}")
    if offsets[-1] > total:
        raise ValueError(f"{name} ends at {offsets[-1]}, past the {total} packed tokens")
    if lengths.max() > max_seqlen:
        raise ValueError(f"{max_name}={max_seqlen} is shorter than the longest sequence in {name} "
                         f"({lengths.max()})")


def _describe(value: Any) -> str:
    if isinstance(value, jax.core.Tracer):
        return f"a traced value ({value.aval.str_short()})"
    return type(value).__name__
