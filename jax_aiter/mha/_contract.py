"""The two dispatched attention ops and how their optional operands travel (docs/attention.md, "Kernel contract").

``flash_attn(q, k, v, *optional, softmax_scale, window, has_bias, has_alibi, dropout_p, deterministic,
return_lse)`` and ``flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *optional, max_seqlen_q,
max_seqlen_k, <same parameters>)``. ``optional`` holds, in this order and only when present: bias (when
``has_bias``), ALiBi slopes float32 ``[B, Hq]`` (when ``has_alibi``), and the dropout seed uint32 ``[2]``
(when ``dropout_p > 0``). Every parameter is a plain static Python value, so each implementation (and a future
FFI kernel) receives exactly the operands it needs and nothing is a placeholder.
"""

from __future__ import annotations

from typing import Any

import jax

FLASH_ATTN = "flash_attn"
FLASH_ATTN_VARLEN = "flash_attn_varlen"


def pack_optional(bias: jax.Array | None, alibi_slopes: jax.Array | None,
                  dropout_seed: jax.Array | None) -> tuple[tuple[jax.Array, ...], dict[str, Any]]:
    """The optional operands in contract order, and the flags that say which are there."""
    operands = tuple(x for x in (bias, alibi_slopes, dropout_seed) if x is not None)
    return operands, {"has_bias": bias is not None, "has_alibi": alibi_slopes is not None}


def unpack_optional(optional: tuple[jax.Array, ...], *, has_bias: bool, has_alibi: bool,
                    dropout_p: float) -> tuple[jax.Array | None, jax.Array | None, jax.Array | None]:
    """``(bias, alibi_slopes, dropout_seed)`` from the operands after the fixed ones, None where absent."""
    rest = iter(optional)
    bias = next(rest) if has_bias else None
    alibi_slopes = next(rest) if has_alibi else None
    dropout_seed = next(rest) if dropout_p > 0 else None
    return bias, alibi_slopes, dropout_seed
