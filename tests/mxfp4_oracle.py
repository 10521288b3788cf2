"""An independent numpy model of docs/mxfp4.md, written unlike jax_aiter.ref.mxfp4 on purpose.

The reference works on float32 bit patterns with integer rounding thresholds; this oracle works on float64
values: scale exponents from frexp / a search, rounding by picking the nearest of all eight E2M1 magnitudes with
an explicit tie rule, hashes in Python-sized integers masked to 32 bits, layouts by explicit index formulas, and
the Hadamard butterfly by looping over index pairs in numpy float32 (which never flushes subnormals, so the
flushing the docs prescribe is applied by hand).
"""

from __future__ import annotations

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MASK32 = 0xFFFFFFFF
ROWWISE_STREAM = 0x6A09E667
COLUMNWISE_STREAM = 0xBB67AE85
MIN_NORMAL = 2.0 ** -126


# --- hashing ---------------------------------------------------------------------------------------------


def fmix32(h):
    h = np.asarray(h, dtype=np.uint64)
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(0x85EBCA6B)) & np.uint64(MASK32)
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(0xC2B2AE35)) & np.uint64(MASK32)
    return h ^ (h >> np.uint64(16))


def sr_hash(key, row, col, stream):
    k0, k1 = (np.uint64(int(k)) for k in key)
    h = fmix32(np.asarray(row, np.uint64) ^ k0)
    h = fmix32(h ^ np.asarray(col, np.uint64))
    return fmix32(h ^ k1 ^ np.uint64(stream))


def hadamard_signs(key, length):
    k0, k1 = (np.uint64(int(k)) for k in key)
    top = fmix32(fmix32(np.arange(length, dtype=np.uint64) ^ k0) ^ k1) >> np.uint64(31)
    return np.where(top == 1, np.float32(-1), np.float32(1)).astype(np.float32)


# --- Hadamard --------------------------------------------------------------------------------------------


def _flush(y):
    return np.where(np.abs(y) < np.float32(MIN_NORMAL), np.copysign(np.float32(0), y), y).astype(np.float32)


def hadamard_rotate(x, size, signs=None):
    """float32 butterfly exactly as the docs order it, one index pair at a time."""
    y = _flush(np.asarray(x, np.float32))
    if signs is not None:
        y = (y * signs).astype(np.float32)
    y = y.copy()
    half = 1
    while half < size:
        for i in range(y.shape[-1]):
            if i & half:
                continue
            low, high = y[..., i].copy(), y[..., i + half].copy()
            y[..., i] = _flush(low + high)
            y[..., i + half] = _flush(low - high)
        half *= 2
    scale = np.float32(0.25) if size == 16 else np.uint32(0x3E3504F3).view(np.float32)
    small = np.abs(y) < np.float32(2.0 ** -123)
    return np.where(small, np.copysign(np.float32(0), y), y * scale).astype(np.float32)


def sylvester_matrix(size):
    h = np.ones((1, 1))
    while h.shape[0] < size:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(size)


# --- quantization ----------------------------------------------------------------------------------------


def scale_exponent(amax, rule):
    """Shared exponent per block from float64 amax (>= 0, finite), clamped to [-127, 127]."""
    amax = np.asarray(amax, np.float64)
    positive = amax > 0
    safe = np.where(positive, amax, 1.0)
    fraction, exponent = np.frexp(safe)  # safe = fraction * 2^exponent, fraction in [0.5, 1)
    significand, unbiased = 2 * fraction, exponent - 1
    if rule == "floor":
        e = unbiased - 2
    elif rule == "even":
        e = unbiased - 2 + (significand >= 1.75)
    elif rule == "ceil":
        e = np.ceil(np.log2(safe / 6.0)).astype(np.int64)
        # log2 is inexact; settle on the smallest e with amax <= 6 * 2^e by direct comparison.
        e = np.where(safe > 6.0 * np.exp2(e.astype(np.float64)), e + 1, e)
        e = np.where(safe <= 6.0 * np.exp2((e - 1).astype(np.float64)), e - 1, e)
    else:
        raise ValueError(rule)
    return np.clip(np.where(positive, e, -127), -127, 127).astype(np.int64)


def _nearest_code(v):
    distance = np.abs(v[..., None] - E2M1)
    candidates = distance == distance.min(axis=-1, keepdims=True)
    # Exactly two candidates means a tie between neighbours: prefer the even code.
    preference = np.where(np.arange(8) % 2 == 0, 2, 1)
    return np.argmax(np.where(candidates, preference, 0), axis=-1)


def _stochastic_code(v, draw):
    lower = np.clip(np.searchsorted(E2M1, v, side="right") - 1, 0, 6)
    spacing_units = (E2M1[lower + 1] - E2M1[lower]) * 2.0 ** 28
    spacing_bits = np.log2(spacing_units).astype(np.int64)
    remainder = np.floor(v * 2.0 ** 28) - E2M1[lower] * 2.0 ** 28
    r = (draw.astype(np.uint64) >> (32 - spacing_bits).astype(np.uint64)).astype(np.float64)
    code = lower + (remainder + r >= spacing_units)
    return np.where(v >= 6.0, 7, code)


def quantize_codes(x, rule, sr_key=None, transposed=False):
    """x [R, C] float32 values (C % 32 == 0) -> (codes uint8 [R, C] with sign bit, scale bytes [R, C/32])."""
    x = np.asarray(x, np.float32).astype(np.float64)
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // 32, 32)
    finite = np.all(np.isfinite(blocks), axis=-1)
    amax = np.max(np.abs(np.where(np.isfinite(blocks), blocks, 0.0)), axis=-1)
    e = scale_exponent(amax, rule)
    v = np.abs(blocks) / np.exp2(e[..., None].astype(np.float64))
    v = np.where(np.isfinite(v), v, 0.0)
    if sr_key is None:
        code = _nearest_code(v)
    else:
        i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        row, col = (j, i) if transposed else (i, j)
        draw = sr_hash(sr_key, row, col, COLUMNWISE_STREAM if transposed else ROWWISE_STREAM).reshape(v.shape)
        code = _stochastic_code(v, draw)
    code = np.where(finite[..., None], code, 0)
    code = np.where((code != 0) & np.signbit(blocks), code + 8, code)
    scales = np.where(finite, e + 127, 255)
    return code.reshape(rows, cols).astype(np.uint8), scales.astype(np.uint8)


def quantize_tiles(x, rule, sr_key=None):
    """float64 values of [R, C] float32 values quantized with one scale per 32 x 32 tile (docs/mxfp4.md, "Weight
    tiles"): NaN for a tile holding a non-finite value."""
    x = np.asarray(x, np.float32).astype(np.float64)
    rows, cols = x.shape
    tiles = x.reshape(rows // 32, 32, cols // 32, 32)
    finite = np.all(np.isfinite(tiles), axis=(1, 3), keepdims=True)
    amax = np.max(np.abs(np.where(np.isfinite(tiles), tiles, 0.0)), axis=(1, 3), keepdims=True)
    scale = np.broadcast_to(np.exp2(scale_exponent(amax, rule).astype(np.float64)), tiles.shape).reshape(rows, cols)
    v = np.abs(x) / scale
    v = np.where(np.isfinite(v), v, 0.0)
    if sr_key is None:
        code = _nearest_code(v)
    else:
        i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        code = _stochastic_code(v, sr_hash(sr_key, i, j, ROWWISE_STREAM))
    values = np.where(np.signbit(x), -1.0, 1.0) * E2M1[code] * scale
    return np.where(np.broadcast_to(finite, tiles.shape).reshape(rows, cols), values, np.nan)


def pack(codes):
    codes = np.asarray(codes, np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def quantize(x, rule="even", sr_key=None, transposed=False, hadamard=0, hadamard_key=None):
    """Rowwise MXFP4 of [R, C] float values -> (packed data, scale bytes), as the docs specify."""
    x = np.asarray(x, np.float32)
    if hadamard:
        signs = None if hadamard_key is None else hadamard_signs(hadamard_key, x.shape[-1])
        x = hadamard_rotate(x, hadamard, signs)
    codes, scales = quantize_codes(x, rule, sr_key, transposed)
    return pack(codes), scales


def dequantize(data, scales):
    """float64 values of packed data [..., K/2] with scale bytes [..., K/32]."""
    data = np.asarray(data, np.uint8)
    codes = np.empty(data.shape[:-1] + (data.shape[-1] * 2,), np.uint8)
    codes[..., 0::2] = data & 0xF
    codes[..., 1::2] = data >> 4
    value = E2M1[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    scale_bytes = np.repeat(np.asarray(scales, np.int64), 32, axis=-1)
    factor = np.where(scale_bytes == 255, np.nan, np.exp2((scale_bytes - 127).astype(np.float64)))
    return value * factor


# --- AITER layouts by index formula ----------------------------------------------------------------------


def shuffle_data(data):
    """out[p] = in[src(p)] with p enumerating (i0, i2, i3, i1, i4) of the (R/16, 16, C/32, 2, 16) view."""
    data = np.asarray(data)
    rows, cols = data.shape
    out = np.empty_like(data).reshape(-1)
    i0, i1, i2, i3, i4 = np.meshgrid(np.arange(rows // 16), np.arange(16), np.arange(cols // 32), np.arange(2),
                                     np.arange(16), indexing="ij")
    destination = (((i0 * (cols // 32) + i2) * 2 + i3) * 16 + i1) * 16 + i4
    out[destination] = data[i0 * 16 + i1, (i2 * 2 + i3) * 16 + i4]
    return out.reshape(rows, cols)


def shuffle_scale_bytes(scales):
    """Zero-pad to (ceil(R/256)*256, ceil(S/8)*8), then p enumerates (b0, b3, b5, b2, b4, b1) of the
    (Rp/32, 2, 16, Sp/8, 2, 4) view."""
    scales = np.asarray(scales)
    rows, cols = scales.shape
    padded_rows, padded_cols = -(-rows // 256) * 256, -(-cols // 8) * 8
    padded = np.zeros((padded_rows, padded_cols), scales.dtype)
    padded[:rows, :cols] = scales
    out = np.empty(padded_rows * padded_cols, scales.dtype)
    b0, b1, b2, b3, b4, b5 = np.meshgrid(np.arange(padded_rows // 32), np.arange(2), np.arange(16),
                                         np.arange(padded_cols // 8), np.arange(2), np.arange(4), indexing="ij")
    destination = ((((b0 * (padded_cols // 8) + b3) * 4 + b5) * 16 + b2) * 2 + b4) * 2 + b1
    out[destination] = padded[b0 * 32 + b1 * 16 + b2, b3 * 8 + b4 * 4 + b5]
    return out.reshape(padded_rows, padded_cols)
