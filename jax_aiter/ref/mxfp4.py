"""MXFP4 reference: block quantization, AITER operand layouts and the emulated FP4 GEMM, in pure JAX.

This module *is* the numerics of ``docs/mxfp4.md``; native kernels must reproduce its bytes exactly. Everything
that decides a quantized byte is done in 32-bit unsigned integer arithmetic on float32 bit patterns, because
XLA's CPU runtime flushes subnormal floats to zero (and GPUs need not), so float arithmetic on tiny values
would differ between platforms. The only float arithmetic is the Hadamard rotation, whose every step is
specified, including how subnormals are flushed.

Quantization works on 2-D arrays with blocks of 32 along the last axis ("rowwise"); a columnwise copy is the
rowwise quantization of the transpose.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

BLOCK = 32
SCALE_RULES = ("even", "floor", "ceil")
HADAMARD_SIZES = (0, 16, 32)
LAYOUTS = ("plain", "gemm_a", "gemm_b")
# What a cast can write a copy as: a packed layout, or "values", the copy's exact values in bf16 (the A operand of
# gemm_bf16_fp4 where the GEMM is emulated, so no FP4 bytes are written only to be dequantized next).
CAST_LAYOUTS = LAYOUTS + ("values",)
NAN_SCALE = 0xFF
# Mixed into the stochastic-rounding hash per copy, so the two copies of one element made by a dual cast round
# independently (and an all-zero key and index still give a non-zero draw). Fractional bits of sqrt(2), sqrt(3).
ROWWISE_STREAM = 0x6A09E667
COLUMNWISE_STREAM = 0xBB67AE85
# float32(1/sqrt(n)): 1/4 exactly for n = 16, 0x3E3504F3 for n = 32.
HADAMARD_SCALE = {16: np.float32(0.25), 32: np.uint32(0x3E3504F3).view(np.float32)}

_SIGN = np.uint32(0x80000000)
_ABS = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)
_NAN_BITS = np.uint32(0x7FC00000)
_MIN_NORMAL_BITS = np.uint32(0x00800000)  # 2^-126
_HADAMARD_SCALE_FLOOR_BITS = np.uint32(0x02000000)  # 2^-123; below it a scaled result could be subnormal
# Round-to-nearest-even thresholds on t = 2*floor(4v) + sticky: code = number of thresholds t reaches.
# Midpoint m (in quarter units) between codes i and i+1 becomes 2m, plus 1 when the tie must stay at the
# even code i.
_RNE_THRESHOLDS = (3, 6, 11, 14, 21, 28, 41)


def _u32(value: int) -> np.uint32:
    return np.uint32(value)


# --- counter-based hashing -------------------------------------------------------------------------------


def fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finalizer: a bijection on uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * _u32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * _u32(0xC2B2AE35)
    return h ^ (h >> 16)


def sr_hash(key: jax.Array, row: jax.Array, col: jax.Array, stream: int) -> jax.Array:
    """The stochastic-rounding draw for element (row, col) of the logical 2-D input."""
    h = fmix32(row ^ key[0])
    h = fmix32(h ^ col)
    return fmix32(h ^ key[1] ^ _u32(stream))


def hadamard_signs(key: jax.Array, index: jax.Array) -> jax.Array:
    """float32 +-1 for global indices along the quantization axis: -1 where the hash's top bit is set."""
    bit = fmix32(fmix32(index ^ key[0]) ^ key[1]) >> 31
    return (1 - 2 * bit.astype(jnp.int32)).astype(jnp.float32)


# --- Hadamard rotation -----------------------------------------------------------------------------------


def _bits(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x, jnp.uint32)


def _float(bits: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(bits, jnp.float32)


def _flush_subnormals(y: jax.Array) -> jax.Array:
    b = _bits(y)
    return _float(jnp.where((b & _ABS) < _MIN_NORMAL_BITS, b & _SIGN, b))


def _sylvester(y: jax.Array, size: int) -> jax.Array:
    """Orthonormal Sylvester Hadamard on each `size`-chunk of the last axis, by the butterfly of the docs: for
    h = 1, 2, 4, ... the pair (y[i], y[i+h]) with i & h == 0 becomes (y[i] + y[i+h], y[i] - y[i+h]), each stage
    flushed to zero below 2^-126; then y * float32(1/sqrt(size)), with |y| < 2^-123 going to zero instead so
    that no rounding ever happens in the subnormal range."""
    shape = y.shape
    half = 1
    while half < size:
        pairs = y.reshape(*shape[:-1], shape[-1] // (2 * half), 2, half)
        low, high = pairs[..., 0, :], pairs[..., 1, :]
        y = _flush_subnormals(jnp.stack([low + high, low - high], axis=-2).reshape(shape))
        half *= 2
    b = _bits(y)
    scaled = y * HADAMARD_SCALE[size]
    return jnp.where((b & _ABS) < _HADAMARD_SCALE_FLOOR_BITS, _float(b & _SIGN), scaled)


def hadamard_rotate(x: jax.Array, size: int, signs: jax.Array | None) -> jax.Array:
    """float32 x -> (x * signs) rotated chunkwise; subnormal inputs count as zero."""
    y = _flush_subnormals(x.astype(jnp.float32))
    if signs is not None:
        y = y * signs
    return _sylvester(y, size)


def hadamard_unrotate(y: jax.Array, size: int, signs: jax.Array | None) -> jax.Array:
    """The inverse of :func:`hadamard_rotate` up to float32 rounding (the transform is symmetric)."""
    x = _sylvester(y.astype(jnp.float32), size)
    return x if signs is None else x * signs


# --- quantization ----------------------------------------------------------------------------------------


def _scale_exponent(amax: jax.Array, scale_rule: str) -> jax.Array:
    """Shared exponent e of each block from the float32 bits of its amax, clamped to [-127, 127]."""
    if scale_rule == "even":
        e = ((amax + _u32(0x200000)) >> 23).astype(jnp.int32) - 129
    elif scale_rule == "floor":
        e = (amax >> 23).astype(jnp.int32) - 129
    elif scale_rule == "ceil":
        # 4 * significand <= 6 exactly when the significand is <= 1.5, i.e. the mantissa field <= 0x400000.
        e = (amax >> 23).astype(jnp.int32) - 129 + ((amax & _u32(0x7FFFFF)) > 0x400000).astype(jnp.int32)
    else:
        raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")
    return jnp.clip(e, -127, 127)


def _fixed_point(magnitude: jax.Array, e: jax.Array) -> tuple[jax.Array, jax.Array]:
    """z = floor(v * 2^28) for v = |x| / 2^e (always < 8, so z < 2^31), and whether bits were dropped."""
    field = (magnitude >> 23).astype(jnp.int32)
    mantissa = magnitude & _u32(0x7FFFFF)
    significand = jnp.where(field == 0, mantissa, mantissa | _u32(0x800000))
    # |x| = significand * 2^(max(field, 1) - 150), so v * 2^28 = significand * 2^(max(field, 1) - 122 - e).
    shift = jnp.maximum(field, 1) - 122 - e
    left = jnp.clip(shift, 0, 31).astype(jnp.uint32)
    right = jnp.clip(-shift, 0, 31).astype(jnp.uint32)
    z = (significand << left) >> right
    lost = (significand & ((_u32(1) << right) - _u32(1))) != 0
    return z, lost


def _round_nearest_even(z: jax.Array, lost: jax.Array) -> jax.Array:
    quarters = z >> 26
    sticky = ((z & _u32((1 << 26) - 1)) != 0) | lost
    t = 2 * quarters + sticky.astype(jnp.uint32)
    code = jnp.zeros_like(t)
    for threshold in _RNE_THRESHOLDS:
        code = code + (t >= threshold).astype(jnp.uint32)
    return code


def _round_stochastic(z: jax.Array, draw: jax.Array) -> jax.Array:
    # Neighbouring E2M1 magnitudes are 0.5 apart below 2, 1 apart in [2, 4) and 2 apart from 4: 2^(27+region)
    # units of z. Adding a uniform draw below one spacing and truncating rounds up with probability equal to the
    # distance past the lower neighbour, in units of the spacing.
    region = (z >= _u32(1 << 29)).astype(jnp.uint32) + (z >= _u32(1 << 30)).astype(jnp.uint32)
    step = (z + (draw >> (5 - region))) >> (27 + region)
    return jnp.minimum(step + 2 * region, _u32(7))


def quantize_rows(x: jax.Array, *, scale_rule: str, sr_key: jax.Array | None, transposed: bool,
                  hadamard: int, hadamard_key: jax.Array | None,
                  index_offset: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Rowwise MXFP4 of a 2-D float array [R, C] (C % 32 == 0) -> (packed uint8 [R, C/2], scale bytes [R, C/32]).

    Hashes use global indices in the logical 2-D input: ``x`` is the tile of it whose first element sits at
    ``index_offset`` = uint32 (row, column) (None: at the origin), and with ``transposed`` it is the transpose
    of that tile (a columnwise copy), whose stochastic rounding also uses the columnwise stream.
    """
    rows, cols = x.shape
    offset = jnp.zeros(2, jnp.uint32) if index_offset is None else index_offset
    view_row = lax.broadcasted_iota(jnp.uint32, (rows, cols), 0)
    view_col = lax.broadcasted_iota(jnp.uint32, (rows, cols), 1)
    row, col = (view_col + offset[0], view_row + offset[1]) if transposed else (view_row + offset[0],
                                                                                  view_col + offset[1])
    if hadamard:
        signs = None
        if hadamard_key is not None:
            # the global index along the quantization axis, which both operands of a GEMM share
            signs = hadamard_signs(hadamard_key, lax.iota(jnp.uint32, cols) + offset[0 if transposed else 1])
        x = hadamard_rotate(x, hadamard, signs)
    bits = _bits(x.astype(jnp.float32)).reshape(rows, cols // BLOCK, BLOCK)
    magnitude = bits & _ABS
    amax = jnp.max(magnitude, axis=-1)  # float32 bit patterns of non-negative values order like the values
    nonfinite = amax >= _INF_BITS
    e = _scale_exponent(amax, scale_rule)
    scales = jnp.where(nonfinite, NAN_SCALE, e + 127).astype(jnp.uint8)

    z, lost = _fixed_point(magnitude, e[..., None])
    if sr_key is None:
        code = _round_nearest_even(z, lost)
    else:
        draw = sr_hash(sr_key, row, col, COLUMNWISE_STREAM if transposed else ROWWISE_STREAM)
        code = _round_stochastic(z, draw.reshape(z.shape))
    code = jnp.where(nonfinite[..., None], _u32(0), code)
    # A zero magnitude is always code 0 (+0), so equal values have equal bytes.
    code = jnp.where(code == 0, code, code | ((bits >> 31) << 3))
    code = code.reshape(rows, cols)
    data = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(jnp.uint8)
    return data, scales


def quantize_tiles(x: jax.Array, *, scale_rule: str, sr_key: jax.Array | None,
                   index_offset: jax.Array | None = None) -> jax.Array:
    """The float32 values of a 2-D float array [R, C] (R, C % 32 == 0) quantized to MXFP4 with one scale per
    32 x 32 tile instead of per 32-element row block: the tile's amax sets its exponent by ``scale_rule``, and
    every element rounds to nearest even (or stochastically: the rowwise hash at its global (row, column),
    ``index_offset`` as in :func:`quantize_rows`) at that exponent; a tile holding a non-finite value is NaN.

    Each result is an E2M1 value times the tile's 2^e. Cast again with 32-element blocks along either axis it
    comes back unchanged: a block's amax is E2M1 * 2^e, whose significand is 1 or 1.5, so every rule picks
    2^e or a smaller power of two at which the block's values are again E2M1 values (at most 6, the same
    significand bits), and nothing rounds. So the rowwise and the columnwise copy of the result hold the same
    matrix: fprop and dgrad multiply by one quantized weight.
    """
    rows, cols = x.shape
    offset = jnp.zeros(2, jnp.uint32) if index_offset is None else index_offset
    bits = _bits(x.astype(jnp.float32))
    magnitude = bits & _ABS
    tiles = magnitude.reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    amax = jnp.max(tiles, axis=(1, 3), keepdims=True)
    nonfinite = jnp.broadcast_to(amax >= _INF_BITS, tiles.shape).reshape(rows, cols)
    e = jnp.broadcast_to(_scale_exponent(amax, scale_rule), tiles.shape).reshape(rows, cols)
    z, lost = _fixed_point(magnitude, e)
    if sr_key is None:
        code = _round_nearest_even(z, lost)
    else:
        row = lax.broadcasted_iota(jnp.uint32, (rows, cols), 0) + offset[0]
        col = lax.broadcasted_iota(jnp.uint32, (rows, cols), 1) + offset[1]
        code = _round_stochastic(z, sr_hash(sr_key, row, col, ROWWISE_STREAM))
    code = jnp.where(nonfinite, _u32(0), code)
    code = jnp.where(code == 0, code, code | ((bits >> 31) << 3))
    return _float(_code_bits(code, jnp.where(nonfinite, NAN_SCALE, e + 127)))


def _dequantized_bits(data: jax.Array, scales: jax.Array) -> jax.Array:
    """float32 bit patterns of the dequantized values of packed uint8 [..., K/2] and scale bytes [..., K/32]."""
    data = data.astype(jnp.uint32)
    codes = jnp.stack([data & 0xF, data >> 4], axis=-1).reshape(*data.shape[:-1], data.shape[-1] * 2)
    return _code_bits(codes, jnp.repeat(scales.astype(jnp.int32), BLOCK, axis=-1))


def _code_bits(codes: jax.Array, scale: jax.Array) -> jax.Array:
    """float32 bit patterns of E2M1 codes (uint32, sign in bit 3) times 2^(scale - 127), one scale byte
    (int32) per element, 255 meaning NaN.

    Elementwise integer arithmetic only (no table lookups), so XLA fuses it into one pass, or into the consumer.
    E2M1 magnitude code m: 0 -> 0, 1 -> 0.5 = 2^-1, and for m >= 2 (1 + (m & 1)/2) * 2^((m >> 1) - 1).
    """
    magnitude = codes & 7
    normal_code = magnitude >= 2
    half = jnp.where(normal_code, magnitude & 1, _u32(0))
    exponent = jnp.where(normal_code, (magnitude >> 1).astype(jnp.int32) - 1, -1)
    field = exponent + scale  # biased float32 exponent of the result
    normal = (field.astype(jnp.uint32) << 23) | (half << 22)
    # Below 2^-126: (2 + half) * 2^(field + 21) units of 2^-149; field >= -1 keeps the shift in [20, 21].
    subnormal = (2 + half) << jnp.clip(field + 21, 0, 31).astype(jnp.uint32)
    bits = jnp.where(field >= 255, _INF_BITS, jnp.where(field >= 1, normal, subnormal))
    bits = jnp.where(magnitude == 0, _u32(0), bits) | ((codes >> 3) << 31)
    return jnp.where(scale == NAN_SCALE, _NAN_BITS, bits)


def dequantize(data: jax.Array, scales: jax.Array, dtype=jnp.float32) -> jax.Array:
    """Packed uint8 [..., K/2] and scale bytes [..., K/32] -> [..., K]; exact in float32 (bits built directly,
    so results in the subnormal range survive a flush-to-zero runtime), then converted to ``dtype``."""
    return _float(_dequantized_bits(data, scales)).astype(dtype)


def dequantize_bf16(data: jax.Array, scales: jax.Array) -> jax.Array:
    """:func:`dequantize` into bfloat16, exactly, for every byte pattern.

    Every MXFP4 value is a bf16 value: bf16 has float32's 8 exponent bits (so the same range, infinities and NaN)
    and 7 fraction bits plus subnormals down to 2^-133, while an MXFP4 value has at most two significant bits
    and, its smallest step being 0.5 * 2^(0 - 127) = 2^-128, is a multiple of 2^-128. So the float32 pattern's
    low 16 bits are zero and its high half is the bf16 pattern: taken directly, no rounding and no subnormal
    flushing can occur.
    """
    bits = _dequantized_bits(data, scales)
    return lax.bitcast_convert_type((bits >> 16).astype(jnp.uint16), jnp.bfloat16)


# --- AITER operand layouts -------------------------------------------------------------------------------


def padded_scale_shape(rows: int, cols: int) -> tuple[int, int]:
    return -(-rows // 256) * 256, -(-cols // 8) * 8


def shuffle_fp4(data: jax.Array) -> jax.Array:
    rows, cols = data.shape
    tiles = data.reshape(rows // 16, 16, cols // 32, 2, 16)
    return tiles.transpose(0, 2, 3, 1, 4).reshape(rows, cols)


def unshuffle_fp4(data: jax.Array) -> jax.Array:
    rows, cols = data.shape
    tiles = data.reshape(rows // 16, cols // 32, 2, 16, 16)
    return tiles.transpose(0, 3, 1, 2, 4).reshape(rows, cols)


def shuffle_scales(scales: jax.Array) -> jax.Array:
    rows, cols = scales.shape
    padded_rows, padded_cols = padded_scale_shape(rows, cols)
    padded = jnp.pad(scales, ((0, padded_rows - rows), (0, padded_cols - cols)))
    tiles = padded.reshape(padded_rows // 32, 2, 16, padded_cols // 8, 2, 4)
    return tiles.transpose(0, 3, 5, 2, 4, 1).reshape(padded_rows, padded_cols)


def unshuffle_scales(scales: jax.Array, shape: tuple[int, int]) -> jax.Array:
    padded_rows, padded_cols = scales.shape
    tiles = scales.reshape(padded_rows // 32, padded_cols // 8, 4, 16, 2, 2)
    plain = tiles.transpose(0, 5, 3, 1, 4, 2).reshape(padded_rows, padded_cols)
    return plain[: shape[0], : shape[1]]


def to_layout(data: jax.Array, scales: jax.Array, layout: str) -> tuple[jax.Array, jax.Array]:
    """"plain": both row-major; "gemm_a": scales shuffled (AITER's A operand); "gemm_b": both shuffled;
    "values": the exact values (:func:`dequantize_bf16`) with row-major scales."""
    if layout == "plain":
        return data, scales
    if layout == "values":
        return dequantize_bf16(data, scales), scales
    return (shuffle_fp4(data) if layout == "gemm_b" else data), shuffle_scales(scales)


# --- the dispatched ops ----------------------------------------------------------------------------------


def cast_mxfp4(x: jax.Array, sr_key: jax.Array, hadamard_key: jax.Array, index_offset: jax.Array, *,
               columnwise: bool, scale_rule: str, stochastic: bool, hadamard: int, hadamard_signs: bool,
               layout: str) -> tuple[jax.Array, jax.Array]:
    """One MXFP4 copy of a 2-D tensor x [M, K]: rowwise ([M, K/2], [M, K/32]) or columnwise, i.e. the rowwise
    copy of x^T ([K, M/2], [K, M/32]); scales padded as the layout says, data as bf16 values [M, K] or [K, M]
    in layout "values". ``index_offset``: where x[0, 0] sits in the logical input, for a tile or shard of it."""
    data, scales = quantize_rows(x.T if columnwise else x, scale_rule=scale_rule,
                                 sr_key=sr_key if stochastic else None, transposed=columnwise,
                                 hadamard=hadamard, hadamard_key=hadamard_key if hadamard_signs else None,
                                 index_offset=index_offset)
    return to_layout(data, scales, layout)


def cast_mxfp4_dual(x: jax.Array, sr_key: jax.Array, hadamard_key: jax.Array, index_offset: jax.Array, *,
                    scale_rule: str, stochastic: bool, hadamard_rowwise: int, hadamard_columnwise: int,
                    hadamard_signs: bool, layout_rowwise: str, layout_columnwise: str
                    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Rowwise and columnwise copies of x: (row data, row scales, column data, column scales)."""
    common = dict(scale_rule=scale_rule, stochastic=stochastic, hadamard_signs=hadamard_signs)
    row = cast_mxfp4(x, sr_key, hadamard_key, index_offset, columnwise=False, hadamard=hadamard_rowwise,
                     layout=layout_rowwise, **common)
    col = cast_mxfp4(x, sr_key, hadamard_key, index_offset, columnwise=True, hadamard=hadamard_columnwise,
                     layout=layout_columnwise, **common)
    return (*row, *col)


def _b_values(b, b_scale, dequantize_fn, b_layout):
    if b_layout == "plain":
        return dequantize_fn(b, b_scale)
    n, half_k = b.shape
    return dequantize_fn(unshuffle_fp4(b), unshuffle_scales(b_scale, (n, half_k * 2 // BLOCK)))


def _gemm_operands(a, b, a_scale, b_scale, dequantize_fn, b_layout):
    m, half_k = a.shape
    a_values = dequantize_fn(a, unshuffle_scales(a_scale, (m, half_k * 2 // BLOCK)))
    return a_values, _b_values(b, b_scale, dequantize_fn, b_layout)


NT = (((1,), (1,)), ((), ()))  # contract both operands' last axes: A . B^T


def gemm_fp4_float32(a: jax.Array, b: jax.Array, a_scale: jax.Array, b_scale: jax.Array, *,
                     b_layout: str = "gemm_b") -> jax.Array:
    """bf16 out[M, N] = A[M, K] . B[N, K]^T from AITER operands (A plain, B and both scales shuffled; with
    ``b_layout="plain"`` B and its scales row-major, unpadded): unshuffle, dequantize exactly into float32,
    multiply in float32 (``Precision.HIGHEST``)."""
    return _dot_float32(*_gemm_operands(a, b, a_scale, b_scale, dequantize, b_layout))


def _dot_float32(a_values: jax.Array, b_values: jax.Array) -> jax.Array:
    out = lax.dot_general(a_values, b_values, NT, precision=lax.Precision.HIGHEST,
                          preferred_element_type=jnp.float32)
    return out.astype(jnp.bfloat16)


def gemm_fp4_bf16_operands(a: jax.Array, b: jax.Array, a_scale: jax.Array, b_scale: jax.Array, *,
                           b_layout: str = "gemm_b") -> jax.Array:
    """:func:`gemm_fp4_float32` on matrix units: both operands dequantized exactly into bf16
    (:func:`dequantize_bf16`), multiplied with float32 accumulation, rounded once to bf16.

    Equal to :func:`gemm_fp4_float32` up to float32 summation order. The operands are the same values, and each
    product of two MXFP4 values (at most 4 significant bits) is exact in float32, hence the same in both, as
    long as it is zero or at least 2^-126 in magnitude, i.e. for every pair of blocks whose scale bytes sum to
    at least 130 (a product is a multiple of 2^(sa + sb - 256) and at least 2^(sa + sb - 256) when non-zero):
    from ~1e-19 times the typical magnitude of a block pair on. Below that a product lies in float32's
    subnormal range, which matrix units and flush-to-zero runtimes (XLA's CPU backend) may flush; the
    difference is then at most K * 2^-126 in absolute value (docs/mxfp4.md, "The emulated GEMM").
    Where every partial sum is exact (a multiple of the smallest product's unit below 2^24 of it), both give
    the same bits.
    """
    a_values, b_values = _gemm_operands(a, b, a_scale, b_scale, dequantize_bf16, b_layout)
    # Asked for in bf16 directly: XLA's compute type for a bf16 GEMM is float32 (cuBLAS, hipBLASLt), rounded
    # once in the epilogue; no float32 result round-trips through memory. (XLA's CPU backend computes it in
    # float32 and converts.) tests/test_gemm_fp4.py checks the float32 accumulation bit for bit on each device.
    return lax.dot_general(a_values, b_values, NT, preferred_element_type=jnp.bfloat16)


def gemm_fp4(a: jax.Array, b: jax.Array, a_scale: jax.Array, b_scale: jax.Array, *,
             b_layout: str = "gemm_b") -> jax.Array:
    """The emulated FP4 GEMM: on the CPU in float32 (:func:`gemm_fp4_float32`), on GPUs on their matrix units
    from exact bf16 operands (:func:`gemm_fp4_bf16_operands`; about 15x faster on an H200, equal up to
    float32 summation order). The choice is made per platform when the program is lowered."""
    return lax.platform_dependent(a, b, a_scale, b_scale, cpu=functools.partial(gemm_fp4_float32, b_layout=b_layout),
                                  default=functools.partial(gemm_fp4_bf16_operands, b_layout=b_layout))


# --- bf16 A, MXFP4 B ---------------------------------------------------------------------------------------


def gemm_bf16_fp4_float32(a: jax.Array, b: jax.Array, b_scale: jax.Array, *, b_layout: str = "gemm_b") -> jax.Array:
    """bf16 out[M, N] = A[M, K] . B[N, K]^T with A in bf16 and B an MXFP4 operand (layouts as
    :func:`gemm_fp4_float32`), in float32 as that: for A the exact values of an MXFP4 copy, the same bits."""
    return _dot_float32(a.astype(jnp.float32), _b_values(b, b_scale, dequantize, b_layout))


def gemm_bf16_fp4_bf16_operands(a: jax.Array, b: jax.Array, b_scale: jax.Array, *,
                                b_layout: str = "gemm_b") -> jax.Array:
    """:func:`gemm_bf16_fp4_float32` on matrix units, as :func:`gemm_fp4_bf16_operands` (B dequantized exactly
    into bf16, float32 accumulation, one rounding): for A the exact values of an MXFP4 copy, the same bits."""
    return lax.dot_general(a, _b_values(b, b_scale, dequantize_bf16, b_layout), NT, preferred_element_type=jnp.bfloat16)


def gemm_bf16_fp4(a: jax.Array, b: jax.Array, b_scale: jax.Array, *, b_layout: str = "gemm_b") -> jax.Array:
    """The emulated GEMM of a bf16 A and an MXFP4 B, per platform as :func:`gemm_fp4`."""
    return lax.platform_dependent(a, b, b_scale, cpu=functools.partial(gemm_bf16_fp4_float32, b_layout=b_layout),
                                  default=functools.partial(gemm_bf16_fp4_bf16_operands, b_layout=b_layout))
