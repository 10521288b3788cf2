"""The two dispatched attention ops and how their operands travel (docs/attention.md, "Kernel contract").

``flash_attn(q, k, v, *optional, options)`` and ``flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
*optional, options)``. ``optional`` holds, in this order and only when present: bias (when
``options.has_bias``), ALiBi slopes float32 ``[B, Hq]`` (when ``options.has_alibi``), and the dropout seed uint32
``[2]`` (when ``options.dropout_p > 0``). ``options`` is one frozen, hashable :class:`AttentionOptions` that every
implementation and ``supports`` check receives, so each implementation gets exactly the operands it needs and
the static parameters are spelled once.
"""

from __future__ import annotations

import dataclasses

import jax

FLASH_ATTN = "flash_attn"
FLASH_ATTN_VARLEN = "flash_attn_varlen"


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """The static part of an attention call, canonical (checked) form.

    ``window`` is ``(left, right)`` with −1 for an unbounded side (causal is ``right = 0``). ``softcap`` > 0
    soft-caps the scaled logits to ``softcap·tanh(logits / softcap)``; 0 leaves them as they are.
    ``max_seqlen_q/k`` are set for ``flash_attn_varlen`` only.
    """

    softmax_scale: float
    window: tuple[int, int]
    has_bias: bool
    has_alibi: bool
    dropout_p: float
    deterministic: bool
    return_lse: bool
    softcap: float = 0.0
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None

    @property
    def varlen(self) -> bool:
        return self.max_seqlen_q is not None

    def unpack(self, optional: tuple[jax.Array, ...]
               ) -> tuple[jax.Array | None, jax.Array | None, jax.Array | None]:
        """``(bias, alibi_slopes, dropout_seed)`` from the operands after the fixed ones, None where absent."""
        rest = iter(optional)
        bias = next(rest) if self.has_bias else None
        alibi_slopes = next(rest) if self.has_alibi else None
        dropout_seed = next(rest) if self.dropout_p > 0 else None
        return bias, alibi_slopes, dropout_seed


def pack_optional(bias: jax.Array | None, alibi_slopes: jax.Array | None,
                  dropout_seed: jax.Array | None) -> tuple[jax.Array, ...]:
    """The optional operands in contract order."""
    return tuple(x for x in (bias, alibi_slopes, dropout_seed) if x is not None)
