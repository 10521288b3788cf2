"""Flash attention for JAX (shipped as the separate ``jax-aiter-mha`` package); see docs/attention.md.

``flash_attn_func`` and ``flash_attn_varlen`` (also under flash-attn's name ``flash_attn_varlen_func``), and
flash-attn's packed-layout wrappers.
"""

from jax_aiter.mha.attention import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                                     flash_attn_varlen, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                                     flash_attn_varlen_qkvpacked_func)

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]
