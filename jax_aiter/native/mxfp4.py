"""The MXFP4 ops as this project's kernels (csrc/cpu/mxfp4.cc, csrc/gpu/mxfp4.cu), byte-for-byte equal to
``jax_aiter.ref.mxfp4``: the casts behind FFI target ``ja_cast_mxfp4``, and ``gemm_fp4`` as the exact bf16
dequantization of both AITER operands (``ja_dequantize_mxfp4``) followed by the reference's bf16 dot.

``jax_aiter.gemm_fp4`` declares the ops and checks every argument before dispatch; these functions take the op
signature. One FFI target serves both ops: ``cast_mxfp4`` asks for one copy,
``cast_mxfp4_dual`` for both, and a copy that is not asked for gets 0-element outputs. The kernels accept every
shape the public functions accept (the quantization axis a multiple of 32, ``gemm_b`` tiles whole); the
operand contract is in ``csrc/include/jax_aiter/mxfp4.h``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_aiter.ref import mxfp4 as ref

TARGET = "ja_cast_mxfp4"
DEQUANTIZE_TARGET = "ja_dequantize_mxfp4"
_NO_COPY = (jax.ShapeDtypeStruct((0, 0), jnp.uint8), jax.ShapeDtypeStruct((0, 0), jnp.uint8))


def _copy_shapes(rows: int, cols: int, layout: str) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """(data, scales) of the rowwise copy of a [rows, cols] view; shuffled scales are zero-padded, and a copy in
    layout "values" has its bf16 values [rows, cols] as data."""
    if layout == "values":
        return (jax.ShapeDtypeStruct((rows, cols), jnp.bfloat16),
                jax.ShapeDtypeStruct((rows, cols // ref.BLOCK), jnp.uint8))
    scales = (rows, cols // ref.BLOCK) if layout == "plain" else ref.padded_scale_shape(rows, cols // ref.BLOCK)
    return jax.ShapeDtypeStruct((rows, cols // 2), jnp.uint8), jax.ShapeDtypeStruct(scales, jnp.uint8)


def _cast_kernel(x, sr_key, hadamard_key, index_offset, *, rowwise: bool, columnwise: bool, scale_rule: str,
          stochastic: bool, hadamard_rowwise: int, hadamard_columnwise: int, hadamard_signs: bool,
          layout_rowwise: str, layout_columnwise: str):
    m, k = x.shape
    outputs = (*(_copy_shapes(m, k, layout_rowwise) if rowwise else _NO_COPY),
               *(_copy_shapes(k, m, layout_columnwise) if columnwise else _NO_COPY))
    call = jax.ffi.ffi_call(TARGET, outputs, vmap_method="sequential")
    return call(x, sr_key, hadamard_key, index_offset, rowwise=rowwise, columnwise=columnwise,
                scale_rule=scale_rule, stochastic=stochastic, hadamard_rowwise=np.int32(hadamard_rowwise),
                hadamard_columnwise=np.int32(hadamard_columnwise), hadamard_signs=hadamard_signs,
                layout_rowwise=layout_rowwise, layout_columnwise=layout_columnwise)


def _cast(x, sr_key, hadamard_key, index_offset, **params):
    """The cast with the derivative every implementation has: none flows through it (zero, as JAX gives for the
    reference, whose rounding is piecewise constant), in forward and reverse mode alike."""

    @jax.custom_jvp
    def cast(x, sr_key, hadamard_key, index_offset):
        return _cast_kernel(x, sr_key, hadamard_key, index_offset, **params)

    @cast.defjvp
    def _(primals, tangents):
        outputs = cast(*primals)
        return outputs, tuple(np.zeros(o.shape, jax.dtypes.float0) if o.dtype == np.uint8 else jnp.zeros_like(o)
                              for o in outputs)

    return cast(x, sr_key, hadamard_key, index_offset)


def cast_mxfp4(x, sr_key, hadamard_key, index_offset, *, columnwise: bool, scale_rule: str, stochastic: bool,
               hadamard: int, hadamard_signs: bool, layout: str):
    row_data, row_scales, col_data, col_scales = _cast(
        x, sr_key, hadamard_key, index_offset, rowwise=not columnwise, columnwise=columnwise,
        scale_rule=scale_rule, stochastic=stochastic, hadamard_rowwise=hadamard, hadamard_columnwise=hadamard,
        hadamard_signs=hadamard_signs, layout_rowwise=layout, layout_columnwise=layout)
    return (col_data, col_scales) if columnwise else (row_data, row_scales)


def cast_mxfp4_dual(x, sr_key, hadamard_key, index_offset, *, scale_rule: str, stochastic: bool,
                    hadamard_rowwise: int, hadamard_columnwise: int, hadamard_signs: bool, layout_rowwise: str,
                    layout_columnwise: str):
    return _cast(x, sr_key, hadamard_key, index_offset, rowwise=True, columnwise=True, scale_rule=scale_rule,
                 stochastic=stochastic, hadamard_rowwise=hadamard_rowwise, hadamard_columnwise=hadamard_columnwise,
                 hadamard_signs=hadamard_signs, layout_rowwise=layout_rowwise, layout_columnwise=layout_columnwise)


def dequantize_bf16(data, scales, *, layout: str):
    """Packed uint8 [R, C/2] and its scales in ``layout`` ("plain", "gemm_a" or "gemm_b") -> bf16 [R, C],
    row-major: :func:`jax_aiter.ref.mxfp4.dequantize_bf16` of the unshuffled operand, bit for bit."""
    rows, half_cols = data.shape
    out = jax.ShapeDtypeStruct((rows, 2 * half_cols), jnp.bfloat16)
    return jax.ffi.ffi_call(DEQUANTIZE_TARGET, out, vmap_method="sequential")(data, scales, layout=layout)


def gemm_fp4(a, b, a_scale, b_scale, *, b_layout: str = "gemm_b"):
    """:func:`jax_aiter.ref.mxfp4.gemm_fp4_bf16_operands` with the operands dequantized by the kernel: the same
    bf16 values, then the same dot, so the same bits."""
    return gemm_bf16_fp4(dequantize_bf16(a, a_scale, layout="gemm_a"), b, b_scale, b_layout=b_layout)


def gemm_bf16_fp4(a, b, b_scale, *, b_layout: str = "gemm_b"):
    """:func:`jax_aiter.ref.mxfp4.gemm_bf16_fp4_bf16_operands` with B dequantized by the kernel: the same bits."""
    return lax.dot_general(a, dequantize_bf16(b, b_scale, layout=b_layout), ref.NT, preferred_element_type=jnp.bfloat16)
