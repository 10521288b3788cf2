"""Flash attention for JAX (shipped as the separate ``jax-aiter-mha`` package); see docs/attention.md."""

from jax_aiter.mha.attention import flash_attn_func, flash_attn_varlen

__all__ = ["flash_attn_func", "flash_attn_varlen"]
