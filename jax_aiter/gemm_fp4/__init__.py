"""MXFP4 (OCP microscaling FP4) quantization, AITER operand layouts and FP4 GEMMs for JAX.

Numerics: docs/mxfp4.md. Functional core (``quantize_mxfp4``, ``cast_mxfp4``, ``gemm_fp4``, ``gemm_bf16_fp4``,
...), object API (``Mxfp4Tensor``, ``MXFP4Quantizer``, ``WeightWorkspace``, ``Mxfp4Recipe``), the training
linear layer ``gemm_fp4_bf16``, whose saved FP4 copies carry the checkpoint names ``CHECKPOINT_NAMES``, and
``quantize_weights``, which makes the weights' copies once per step as ``Mxfp4Weight``s for it.
"""

from jax_aiter.gemm_fp4._gemm import gemm_bf16_fp4, gemm_fp4
from jax_aiter.gemm_fp4._layout import shuffle_fp4, shuffle_scales, unshuffle_fp4, unshuffle_scales
from jax_aiter.gemm_fp4._linear import (ACTIVATION_COPY_NAME, CHECKPOINT_NAMES, WEIGHT_COPY_NAME, gemm_fp4_bf16,
                                        quantize_weights)
from jax_aiter.gemm_fp4._quantize import cast_mxfp4, cast_mxfp4_dual, dequantize_mxfp4, quantize_mxfp4
from jax_aiter.gemm_fp4.recipe import Mxfp4Recipe
from jax_aiter.gemm_fp4.tensor import MXFP4Quantizer, Mxfp4Copies, Mxfp4Tensor, Mxfp4Weight, WeightWorkspace

__all__ = [
    "ACTIVATION_COPY_NAME",
    "CHECKPOINT_NAMES",
    "WEIGHT_COPY_NAME",
    "MXFP4Quantizer",
    "Mxfp4Copies",
    "Mxfp4Recipe",
    "Mxfp4Tensor",
    "Mxfp4Weight",
    "WeightWorkspace",
    "cast_mxfp4",
    "cast_mxfp4_dual",
    "dequantize_mxfp4",
    "gemm_bf16_fp4",
    "gemm_fp4",
    "gemm_fp4_bf16",
    "quantize_mxfp4",
    "quantize_weights",
    "shuffle_fp4",
    "shuffle_scales",
    "unshuffle_fp4",
    "unshuffle_scales",
]
