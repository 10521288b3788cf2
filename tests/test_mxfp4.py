"""MXFP4 quantization, Hadamard rotation, stochastic rounding and AITER layouts, bit-exact against the
independent numpy oracle in mxfp4_oracle.py."""

import functools
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import _oracle
import _property
import mxfp4_oracle as oracle
from jax_aiter import _backend, _native, use_backend
from jax_aiter.gemm_fp4 import (cast_mxfp4, cast_mxfp4_dual, dequantize_mxfp4, quantize_mxfp4, shuffle_fp4,
                                shuffle_scales, unshuffle_fp4, unshuffle_scales)
from jax_aiter.gemm_fp4._quantize import key_words
from jax_aiter.ref import mxfp4 as ref

RULES = ("even", "floor", "ceil")
rotate = jax.jit(ref.hadamard_rotate, static_argnums=1)
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)


def assert_matches_oracle(x, rule, **options):
    data, scales = quantize_mxfp4(jnp.asarray(x), scale_rule=rule, **options)
    words = {name: tuple(int(w) for w in key_words(options[name], name)) if options.get(name) is not None else None
             for name in ("sr_key", "hadamard_key")}
    want_data, want_scales = oracle.quantize(np.asarray(x, np.float32).reshape(-1, x.shape[-1]), rule,
                                             sr_key=words["sr_key"], hadamard=options.get("hadamard") or 0,
                                             hadamard_key=words["hadamard_key"])
    np.testing.assert_array_equal(np.asarray(scales).reshape(want_scales.shape), want_scales)
    np.testing.assert_array_equal(np.asarray(data).reshape(want_data.shape), want_data)


def random_values(rng, shape, low_exp=-30, high_exp=30):
    return (rng.standard_normal(shape) * np.exp2(rng.integers(low_exp, high_exp, shape[:-1] + (1,)))).astype(np.float32)


# --- element and scale rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES)
def test_every_finite_bf16_pattern_under_several_scales(rule):
    patterns = np.arange(2 ** 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    finite = patterns[np.isfinite(patterns.astype(np.float32))]
    finite = np.concatenate([finite, np.zeros(-len(finite) % 31, ml_dtypes.bfloat16)]).reshape(-1, 31)
    # Each block leads with an anchor that sets (or, when smaller than some pattern, leaves) the block scale.
    anchors = [2.0 ** -133, -1.5 * 2.0 ** -127, 2.0 ** -100, 1.0, -1.75, 5.0, 1.25 * 2.0 ** 100, BF16_MAX]
    blocks = [np.concatenate([np.full((len(finite), 1), a, ml_dtypes.bfloat16), finite], axis=1) for a in anchors]
    assert_matches_oracle(np.concatenate(blocks), rule)


def _fixture_output(tmp_path, host_cxx, *args):
    """What tests/fixtures/mxfp4/subnormal_codes.cc (built for the host) writes with ``args``, as bytes."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    exe = tmp_path / "subnormal_codes"
    subprocess.run([host_cxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{repo / 'csrc/include'}",
                    str(repo / "tests/fixtures/mxfp4/subnormal_codes.cc"), "-o", str(exe)], check=True)
    return subprocess.run([str(exe), *args], capture_output=True, check=True).stdout


def _encoder_codes(tmp_path, host_cxx, *args):
    """Codes the fixture writes with ``args``: one per nibble."""
    raw = np.frombuffer(_fixture_output(tmp_path, host_cxx, *args), np.uint8)
    return np.stack([raw & 15, raw >> 4], axis=-1).reshape(-1)


ENCODER_EXPONENTS = np.arange(-127, 24)  # the shared exponents the subnormal-float encoders serve


def _oracle_codes(x, e):
    """The reference's code of each float64 value x under shared exponent e, where a block with that exponent
    can hold x (|x| < 8 * 2^e under every rule; NaN and Inf never get here), and that mask."""
    v = np.abs(x) * 2.0 ** -int(e)
    inside = np.isfinite(x) & (v < 8)
    code = oracle._nearest_code(v[inside])
    return code | np.where(np.signbit(x[inside]) & (code > 0), 8, 0), inside


def test_cuda_bf16_encoder_on_every_pattern_and_exponent(tmp_path, host_cxx):
    """The CUDA kernels' bf16 encoder (codes through subnormal floats, mxfp4_codec.h) against the float64 oracle:
    every bf16 pattern under every shared exponent it serves (-127..23), in the row form and in both halves of
    the column form."""
    nibbles = _encoder_codes(tmp_path, host_cxx).reshape(len(ENCODER_EXPONENTS), 3, 2 ** 16)
    x = np.arange(2 ** 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32).astype(np.float64)
    checked = 0
    for e, got in zip(ENCODER_EXPONENTS, nibbles):
        want, inside = _oracle_codes(x, e)
        for form in got:
            np.testing.assert_array_equal(form[inside], want, err_msg=f"e={e}")
        checked += inside.sum()
    assert checked > 3_000_000


# The low halves the fixture puts under every bf16 pattern for the float32 encoder (its kLowHalves).
FLOAT_ENCODER_LOW_HALVES = (0x0000, 0x0001, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF)


def test_cuda_float_encoder_rounds_float32_values_once(tmp_path, host_cxx):
    """The CUDA kernels' encoder of rotated (float32) values, which rounds them to odd at bf16 precision before
    the bf16 encoder: against the float64 oracle on the float32 values just around every tie and every bf16 value
    (every high half with low halves 0, 1, 1/4, 1/2 - 1, 1/2, 1/2 + 1, 3/4, 1 - 1 of the bf16 unit), under every
    exponent it serves. Rounding twice to nearest (dropping the low half first) would fail it: 0x8000 and 0x8001
    under a tie differ only in the second rounding's tie rule."""
    lows = np.array(FLOAT_ENCODER_LOW_HALVES, np.uint32)
    nibbles = _encoder_codes(tmp_path, host_cxx, "float").reshape(len(ENCODER_EXPONENTS), len(lows), 2 ** 16)
    bits = (np.arange(2 ** 16, dtype=np.uint32)[None, :] << 16) | lows[:, None]
    with np.errstate(invalid="ignore"):  # signalling NaN patterns; the oracle leaves non-finite values out
        x = bits.view(np.float32).astype(np.float64)
    checked = 0
    for e, got in zip(ENCODER_EXPONENTS, nibbles):
        want, inside = _oracle_codes(x, e)
        np.testing.assert_array_equal(got[inside], want, err_msg=f"e={e}")
        checked += inside.sum()
    assert checked > 24_000_000


def test_stochastic_rounding_fixed_point_from_bits(tmp_path, host_cxx):
    """Stochastic rounding's z = floor(v * 2^28), which the codec takes from v's bits with integer shifts instead of
    a float-to-integer conversion (mxfp4::fixed_point_28), against float64 on every non-negative float32 v below 8
    whose high half is a bf16 pattern, with each low half of the encoder fixture: normals of every binade, subnormals
    and zero (z = 0 below 2^-28) and the values just around each integer z."""
    got = np.frombuffer(_fixture_output(tmp_path, host_cxx, "fixed_point"), "<u4")
    lows = np.array(FLOAT_ENCODER_LOW_HALVES, np.uint32)
    bits = ((np.arange(0x4100, dtype=np.uint32)[:, None] << 16) | lows[None, :]).reshape(-1)
    want = np.floor(bits.view(np.float32).astype(np.float64) * 2.0 ** 28)
    assert got.shape == want.shape and want.max() >= 2 ** 30
    np.testing.assert_array_equal(got.astype(np.float64), want)


def test_nonfinite_bf16_patterns_poison_only_their_block():
    patterns = np.arange(2 ** 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    bad = patterns[~np.isfinite(patterns.astype(np.float32))]
    assert len(bad) == 2 * 128  # +-Inf and every NaN payload
    x = np.tile(np.linspace(-3, 3, 64, dtype=np.float32), (len(bad), 1)).astype(ml_dtypes.bfloat16)
    x[:, 7] = bad
    data, scales = quantize_mxfp4(jnp.asarray(x))
    good_data, good_scales = quantize_mxfp4(jnp.asarray(x[:, 32:]))
    assert np.all(np.asarray(scales)[:, 0] == 0xFF) and np.all(np.asarray(data)[:, :16] == 0)
    np.testing.assert_array_equal(np.asarray(scales)[:, 1:], good_scales)
    np.testing.assert_array_equal(np.asarray(data)[:, 16:], good_data)
    values = np.asarray(dequantize_mxfp4(data, scales))
    assert np.all(np.isnan(values[:, :32])) and np.all(np.isfinite(values[:, 32:]))


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.float32, (4, 64), elements=st.floats(width=32)), rule=st.sampled_from(RULES))
def test_random_float32_blocks(x, rule):
    assert_matches_oracle(x, rule)


@pytest.mark.parametrize("rule", RULES)
def test_random_blocks_with_wide_exponents(rule):
    rng = np.random.default_rng(1)
    assert_matches_oracle(random_values(rng, (96, 128), -150, 127), rule)


def test_zero_blocks_are_zero_bytes():
    x = np.zeros((3, 96), np.float32)
    x[1] = -0.0
    x[2, 32:64] = np.linspace(-1, 1, 32)
    data, scales = map(np.asarray, quantize_mxfp4(jnp.asarray(x)))
    assert np.all(data[:2] == 0) and np.all(scales[:2] == 0)
    assert scales[2, 0] == 0 and scales[2, 2] == 0 and np.all(data[2, :16] == 0) and np.all(data[2, 32:] == 0)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_subnormal_inputs(dtype):
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    rng = np.random.default_rng(2)
    x = (rng.integers(-300, 300, (8, 64)) * tiny).astype(dtype)
    assert_matches_oracle(x, "even")
    # float32 subnormals: scale 2^-127 (byte 0) and exact values in the E2M1 grid times 2^-127.
    values = np.array([1.5, -0.5, 1.0, 0.25, 0.75, 3.0] + [0.0] * 26, np.float32) * np.float32(2.0 ** -127)
    data, scales = quantize_mxfp4(jnp.asarray(values[None]))
    assert int(scales[0, 0]) == 0
    np.testing.assert_array_equal(np.asarray(dequantize_mxfp4(data, scales))[0, :6],
                                  np.array([1.5, -0.5, 1.0, 0.0, 1.0, 3.0]) * 2.0 ** -127)


def test_round_to_nearest_even_ties_and_saturation():
    # amax 6.0 gives e = 0 under every rule, so the elements are the E2M1 inputs themselves.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.1, -5.0, 0.2500001, 5.01]
    x = np.array(ties + [0.0] * (32 - len(ties)), np.float32)
    for rule in RULES:
        data, scales = quantize_mxfp4(jnp.asarray(x), scale_rule=rule)
        assert int(scales[0]) == 127
        got = np.asarray(dequantize_mxfp4(data, scales))[: len(ties)]
        np.testing.assert_array_equal(got, [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 0.0, -4.0, 0.5, 6.0])
    # Saturation: under "floor", 7 = 1.75 * 4 keeps e = 0 and clips to 6; "even" and "ceil" move to e = 1.
    x = np.array([7.0, -7.5] + [0.0] * 30, np.float32)
    expected = {"floor": (127, [6.0, -6.0]), "even": (128, [8.0, -8.0]), "ceil": (128, [8.0, -8.0])}
    for rule, (scale, values) in expected.items():
        data, scales = quantize_mxfp4(jnp.asarray(x), scale_rule=rule)
        assert int(scales[0]) == scale
        np.testing.assert_array_equal(np.asarray(dequantize_mxfp4(data, scales))[:2], values)


@pytest.mark.parametrize("amax, even, floor, ceil", [
    (1.0, 125, 125, 125), (1.5, 125, 125, 125), (1.6, 125, 125, 126), (1.75, 126, 125, 126),
    (6.0, 127, 127, 127), (2.0 ** -140, 0, 0, 0), (0.0, 0, 0, 0), (BF16_MAX, 253, 252, 253),
])
def test_scale_bytes_per_rule(amax, even, floor, ceil):
    x = np.zeros(32, np.float32)
    x[5] = -amax
    for rule, byte in (("even", even), ("floor", floor), ("ceil", ceil)):
        assert int(quantize_mxfp4(jnp.asarray(x), scale_rule=rule)[1][0]) == byte, rule


def test_negative_zero_is_canonical():
    x = np.array([-0.0, -0.1, -1e-30, 6.0] + [-0.0] * 28, np.float32)
    data = np.asarray(quantize_mxfp4(jnp.asarray(x))[0])
    assert data[0] == 0 and data[1] == (7 << 4) and np.all(data[2:] == 0)


# --- dequantization and round trips -----------------------------------------------------------------------


def test_dequantize_every_byte_under_every_scale():
    data = np.tile(np.arange(256, dtype=np.uint8).reshape(16, 16), (256, 1))  # every pair of codes, -0 included
    scales = np.repeat(np.arange(256, dtype=np.uint8), 16)[:, None]
    with np.errstate(over="ignore"):
        want = oracle.dequantize(data, scales).astype(np.float32)
    got = np.asarray(dequantize_mxfp4(jnp.asarray(data), jnp.asarray(scales)))
    # Bit patterns, so signed zeros, subnormals, overflow to Inf and the NaN blocks all count.
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint32)[finite], want.view(np.uint32)[finite])
    for dtype in (jnp.bfloat16, jnp.float16):
        out = dequantize_mxfp4(jnp.asarray(data), jnp.asarray(scales), dtype=dtype)
        assert out.dtype == dtype
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(np.asarray(out).astype(np.float32), want.astype(dtype).astype(np.float32))


@pytest.mark.parametrize("rule", RULES)
def test_quantize_of_dequantized_is_identity(rule):
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (64, 128)).astype(np.uint8)
    codes[codes == 8] = 0  # -0 is never produced
    codes[:, ::32] = rng.choice([7, 15], (64, 4))  # +-6 in every block pins the scale under every rule
    data = oracle.pack(codes)
    scales = rng.integers(1, 250, (64, 4)).astype(np.uint8)
    values = dequantize_mxfp4(jnp.asarray(data), jnp.asarray(scales))
    again = quantize_mxfp4(values, scale_rule=rule)
    np.testing.assert_array_equal(np.asarray(again[0]), data)
    np.testing.assert_array_equal(np.asarray(again[1]), scales)


def test_leading_axes_are_rows_of_one_logical_input():
    rng = np.random.default_rng(4)
    x = random_values(rng, (6, 64))
    flat = quantize_mxfp4(jnp.asarray(x), sr_key=7)
    batched = quantize_mxfp4(jnp.asarray(x.reshape(2, 3, 64)), sr_key=7)
    assert batched[0].shape == (2, 3, 32) and batched[1].shape == (2, 3, 2)
    np.testing.assert_array_equal(np.asarray(batched[0]).reshape(6, 32), flat[0])
    np.testing.assert_array_equal(np.asarray(batched[1]).reshape(6, 2), flat[1])


# --- stochastic rounding ----------------------------------------------------------------------------------


def test_hash_test_vectors_from_the_docs():
    vectors = [((0, 0), 0, 0, ref.ROWWISE_STREAM, 0x09F45F69), ((0, 0), 0, 1, ref.ROWWISE_STREAM, 0x06BB9E14),
               ((0x12345678, 0x9ABCDEF0), 3, 5, ref.ROWWISE_STREAM, 0x8A5D04D5),
               ((0x12345678, 0x9ABCDEF0), 3, 5, ref.COLUMNWISE_STREAM, 0xA3E998AD)]
    for key, row, col, stream, want in vectors:
        got = ref.sr_hash(jnp.asarray(key, jnp.uint32), jnp.uint32(row), jnp.uint32(col), stream)
        assert int(got) == want == int(oracle.sr_hash(key, row, col, stream))
    signs = [-1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, -1, -1, 1, 1, 1]
    got = ref.hadamard_signs(jnp.asarray([0x12345678, 0x9ABCDEF0], jnp.uint32), jnp.arange(16, dtype=jnp.uint32))
    np.testing.assert_array_equal(got, signs)


@pytest.mark.parametrize("rule", RULES)
def test_stochastic_rounding_matches_oracle(rule):
    rng = np.random.default_rng(5)
    x = random_values(rng, (64, 96), -140, 100)
    x[3, :32] = 0.0
    x[4, 9] = np.inf
    for key in [(0, 0), (0xDEADBEEF, 12345)]:
        assert_matches_oracle(x, rule, sr_key=np.asarray(key, np.uint32))
    # Columnwise copies hash (row, col) of the logical input with their own stream.
    key = (99, 1)
    data, scales = cast_mxfp4(jnp.asarray(x), columnwise=True, scale_rule=rule, sr_key=np.asarray(key, np.uint32))
    want = oracle.quantize(x.T, rule, sr_key=key, transposed=True)
    np.testing.assert_array_equal(data, want[0])
    np.testing.assert_array_equal(scales, want[1])


def test_stochastic_rounding_reproducible_and_key_dependent():
    x = jnp.asarray(random_values(np.random.default_rng(6), (32, 256)))
    first = quantize_mxfp4(x, sr_key=jax.random.key(1))[0]
    np.testing.assert_array_equal(first, quantize_mxfp4(x, sr_key=jax.random.key(1))[0])
    other = quantize_mxfp4(x, sr_key=jax.random.key(2))[0]
    nearest = quantize_mxfp4(x)[0]
    # An element a fraction p between grid points: two keys round it apart with chance 2p(1 - p) (1/3 on average),
    # a key and nearest rounding with min(p, 1 - p) (1/4): 5/9 and 7/16 of the bytes (two elements each) differ.
    assert np.mean(np.asarray(first) != np.asarray(other)) > 0.2
    assert np.mean(np.asarray(first) != np.asarray(nearest)) > 0.2


def test_stochastic_rounding_is_unbiased():
    # Block layout: a 6.0 pins e = 0, the other 31 elements sweep [-6, 6] including grid points and ties.
    values = np.concatenate([[6.0], np.linspace(-6.0, 6.0, 31)]).astype(np.float32)
    rows = 8192
    x = np.tile(values, (rows, 1))
    data, scales = quantize_mxfp4(jnp.asarray(x), sr_key=jax.random.key(3))
    mean = np.asarray(dequantize_mxfp4(data, scales)).astype(np.float64).mean(axis=0)
    spacing = np.where(np.abs(values) < 2, 0.5, np.where(np.abs(values) < 4, 1.0, 2.0))
    tolerance = 5 * 0.5 * spacing / np.sqrt(rows)  # five standard deviations of a mean of two-point draws
    assert np.all(np.abs(mean - values) <= tolerance), np.abs(mean - values) / tolerance


@pytest.mark.parametrize("impl", ["native", "xla"])
def test_tiles_with_their_offsets_reproduce_the_whole_cast(impl):
    # Shards or kernel tiles hash global indices, so stitching tiles gives the unsplit result.
    if impl == "native" and _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    with use_backend(impl):
        _check_tiles_reproduce_the_whole_cast()


def _check_tiles_reproduce_the_whole_cast():
    x = jnp.asarray(random_values(np.random.default_rng(16), (64, 128)))
    options = dict(sr_key=21, hadamard_rowwise=16, hadamard_columnwise=32, hadamard_key=4)
    (row, row_scales), (col, col_scales) = cast_mxfp4_dual(x, **options)
    for r0, c0 in [(0, 64), (32, 0), (32, 64)]:
        offset = np.asarray([r0, c0], np.uint32)
        (tile_row, tile_row_scales), (tile_col, tile_col_scales) = cast_mxfp4_dual(
            x[r0:r0 + 32, c0:c0 + 64], index_offset=offset, **options)
        np.testing.assert_array_equal(tile_row, row[r0:r0 + 32, c0 // 2:c0 // 2 + 32])
        np.testing.assert_array_equal(tile_row_scales, row_scales[r0:r0 + 32, c0 // 32:c0 // 32 + 2])
        np.testing.assert_array_equal(tile_col, col[c0:c0 + 64, r0 // 2:r0 // 2 + 16])
        np.testing.assert_array_equal(tile_col_scales, col_scales[c0:c0 + 64, r0 // 32:r0 // 32 + 1])


def test_key_forms():
    np.testing.assert_array_equal(key_words(0x0000000500000007, "k"), [7, 5])
    key = jax.random.key(11)
    np.testing.assert_array_equal(key_words(key, "k"), jax.random.bits(key, (2,), jnp.uint32))
    x = jnp.asarray(random_values(np.random.default_rng(7), (4, 64)))
    words = np.asarray([7, 5], np.uint32)
    np.testing.assert_array_equal(quantize_mxfp4(x, sr_key=0x0000000500000007)[0], quantize_mxfp4(x, sr_key=words)[0])


# --- Hadamard rotation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [16, 32])
@pytest.mark.parametrize("signed", [False, True])
def test_hadamard_rotation_bit_exact(size, signed):
    rng = np.random.default_rng(8)
    x = random_values(rng, (16, 64), -135, 60)
    x[0, :8] = np.float32(2.0 ** -126) * np.array([1.5, -1, 0.75, 3, -2, 1, 1, 0.5], np.float32)  # flush paths
    key = np.asarray([5, 6], np.uint32)
    signs = oracle.hadamard_signs(key, 64) if signed else None
    ref_signs = ref.hadamard_signs(jnp.asarray(key), jnp.arange(64, dtype=jnp.uint32))
    np.testing.assert_array_equal(ref_signs, oracle.hadamard_signs(key, 64))
    got = np.asarray(rotate(jnp.asarray(x), size, ref_signs if signed else None))
    np.testing.assert_array_equal(got, oracle.hadamard_rotate(x, size, signs))
    # It is the orthonormal Sylvester matrix up to float32 rounding: each of the log2(size) butterfly stages errs
    # by 2^-24 of its chunk's sum|x| at most (scaled by 1/sqrt(size) after), the rounded 1/sqrt(size) and the
    # product by it by 2^-24 of the result each, and flushing below 2^-126 (inputs, stages, the scaled result)
    # moves an output by less than size 2^-126.
    exact = ((x.astype(np.float64) * (1 if signs is None else signs)).reshape(16, -1, size)
             @ oracle.sylvester_matrix(size)).reshape(16, 64)
    chunk_sums = np.repeat(np.abs(x.astype(np.float64)).reshape(16, -1, size).sum(axis=2), size, axis=1)
    bound = 2.0 ** -24 * (np.log2(size) * chunk_sums / np.sqrt(size) + 2 * np.abs(exact)) + size * 2.0 ** -126
    err = np.abs(got - exact)
    assert np.all(err <= bound), float(np.max(err / bound))


def test_quantization_with_hadamard_matches_oracle():
    x = random_values(np.random.default_rng(9), (32, 128), -20, 20)
    assert_matches_oracle(x, "even", hadamard=16)
    assert_matches_oracle(x, "floor", hadamard=32, hadamard_key=np.asarray([3, 4], np.uint32),
                          sr_key=np.asarray([1, 2], np.uint32))


def test_paired_hadamard_leaves_the_product_unchanged():
    rng = np.random.default_rng(10)
    x, w = rng.standard_normal((8, 64)), rng.standard_normal((8, 64))
    signs = oracle.hadamard_signs((9, 9), 64)
    # Bounds in units of |x_i| |w_j| (Cauchy-Schwarz: a rotation keeps norms, so sum|x'_k w'_k| <= |x_i| |w_j|).
    norms = np.outer(np.linalg.norm(x, axis=1), np.linalg.norm(w, axis=1))
    for size in (16, 32):
        h = np.kron(np.eye(64 // size), oracle.sylvester_matrix(size))
        # Float64: the twice-rounded +-1/sqrt(size), its squares and size - 1 additions: 36 units of 2^-53 (< 2^6).
        np.testing.assert_allclose(h @ h.T, np.eye(64), rtol=0, atol=2.0 ** -47)
        exact_rotation = lambda t: (t * signs) @ h  # noqa: E731
        # Float64, in units of 2^-53 |x_i| |w_j|: 64 for each of the two 64-term product sums; each rotated element
        # errs by size + 2 units of its chunk's norm, a rotated row by (size + 2) sqrt(size) of its norm, twice in
        # the product (385 at most): under 2^10 in all.
        ratio = np.abs(exact_rotation(x) @ exact_rotation(w).T - x @ w.T) / (2.0 ** -43 * norms)
        assert np.all(ratio <= 1), float(np.max(ratio))
        ours = np.asarray(rotate(jnp.asarray(np.concatenate([x, w]), jnp.float32), size, jnp.asarray(signs)),
                          np.float64)
        # Float32, in units of 2^-24 |x_i| |w_j|: per rotated row, 1 for rounding the inputs, 2 for the scale and
        # log2(size) per element of its chunk's norm (log2(size) sqrt(size) of the row's); twice: 63 at most.
        ratio = np.abs(ours[:8] @ ours[8:].T - x @ w.T) / (2.0 ** -18 * norms)
        assert np.all(ratio <= 1), float(np.max(ratio))


def test_hadamard_key_changes_signs_and_bytes():
    x = jnp.asarray(random_values(np.random.default_rng(11), (8, 64)))
    a = quantize_mxfp4(x, hadamard=16, hadamard_key=1)[0]
    b = quantize_mxfp4(x, hadamard=16, hadamard_key=2)[0]
    plain = quantize_mxfp4(x, hadamard=16)[0]
    assert np.mean(np.asarray(a) != np.asarray(b)) > 0.2 and np.mean(np.asarray(a) != np.asarray(plain)) > 0.2


# --- AITER layouts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows, cols", [(16, 32), (48, 96), (256, 64)])
def test_data_shuffle_index_formula_and_inverse(rows, cols):
    data = np.random.default_rng(12).integers(0, 256, (rows, cols)).astype(np.uint8)
    shuffled = shuffle_fp4(jnp.asarray(data))
    np.testing.assert_array_equal(shuffled, oracle.shuffle_data(data))
    np.testing.assert_array_equal(unshuffle_fp4(shuffled), data)


@pytest.mark.parametrize("rows, cols", [(1, 1), (40, 4), (256, 8), (300, 13)])
def test_scale_shuffle_index_formula_padding_and_inverse(rows, cols):
    scales = np.random.default_rng(13).integers(1, 256, (rows, cols)).astype(np.uint8)
    shuffled = np.asarray(shuffle_scales(jnp.asarray(scales)))
    want = oracle.shuffle_scale_bytes(scales)
    np.testing.assert_array_equal(shuffled, want)
    assert shuffled.shape == (-(-rows // 256) * 256, -(-cols // 8) * 8)
    assert np.count_nonzero(shuffled) == rows * cols  # padding is zero, data all non-zero
    np.testing.assert_array_equal(unshuffle_scales(jnp.asarray(shuffled), (rows, cols)), scales)


def test_cast_layouts_and_dual_cast():
    x = jnp.asarray(random_values(np.random.default_rng(14), (64, 128)))
    plain = cast_mxfp4(x)
    gemm_a = cast_mxfp4(x, layout="gemm_a")
    gemm_b = cast_mxfp4(x, layout="gemm_b")
    np.testing.assert_array_equal(gemm_a[0], plain[0])
    np.testing.assert_array_equal(gemm_a[1], shuffle_scales(plain[1]))
    np.testing.assert_array_equal(gemm_b[0], shuffle_fp4(plain[0]))
    np.testing.assert_array_equal(gemm_b[1], gemm_a[1])
    np.testing.assert_array_equal(cast_mxfp4(x, columnwise=True)[0], quantize_mxfp4(x.T)[0])
    # A dual cast is exactly the two single casts.
    options = dict(scale_rule="ceil", sr_key=3)
    row, col = cast_mxfp4_dual(x, layout_rowwise="gemm_a", layout_columnwise="gemm_b", **options)
    for got, want in zip(row + col, cast_mxfp4(x, layout="gemm_a", **options)
                         + cast_mxfp4(x, columnwise=True, layout="gemm_b", **options)):
        np.testing.assert_array_equal(got, want)


# --- transformations and backend integration --------------------------------------------------------------


def test_jit_and_vmap():
    x = jnp.asarray(random_values(np.random.default_rng(15), (2, 32, 64)))
    eager = quantize_mxfp4(x)
    for got in (jax.jit(quantize_mxfp4)(x), jax.vmap(quantize_mxfp4)(x)):
        np.testing.assert_array_equal(got[0], eager[0])
        np.testing.assert_array_equal(got[1], eager[1])
    # Under vmap every slice is its own logical input, so stochastic rounding hashes per-slice indices.
    mapped = jax.vmap(lambda t: quantize_mxfp4(t, sr_key=5))(x)
    for i in range(2):
        np.testing.assert_array_equal(mapped[0][i], quantize_mxfp4(x[i], sr_key=5)[0])


def test_ops_are_dispatched_with_plain_static_parameters():
    assert {"cast_mxfp4", "cast_mxfp4_dual", "gemm_fp4"} <= set(_backend.defined_ops())
    for op in ("cast_mxfp4", "cast_mxfp4_dual", "gemm_fp4"):
        args, params = _backend._OPS[op].example()
        assert all(isinstance(v, (bool, int, str)) for v in params.values())
        jax.eval_shape(lambda *a: _backend.select_reference(op).fn(*a, **params), *args)  # noqa: B023
    x = jnp.ones((32, 64), jnp.bfloat16)
    with use_backend("xla"):
        np.testing.assert_array_equal(cast_mxfp4(x)[0], quantize_mxfp4(x)[0])


@pytest.mark.parametrize("call, error, name", [
    (lambda: quantize_mxfp4(jnp.ones((4, 32), jnp.int32)), TypeError, "x"),
    (lambda: quantize_mxfp4(jnp.ones((4, 48))), ValueError, "x"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), scale_rule="nearest"), ValueError, "scale_rule"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), hadamard=8), ValueError, "hadamard"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), hadamard=16.0), TypeError, "hadamard"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), hadamard_key=1), ValueError, "hadamard_key"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), sr_key=jnp.ones(2, jnp.int32)), TypeError, "sr_key"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), sr_key=-1), ValueError, "sr_key"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), sr_key="seed"), TypeError, "sr_key"),
    (lambda: quantize_mxfp4(jnp.ones((4, 32)), sr_key=jax.random.split(jax.random.key(0))), ValueError, "sr_key"),
    (lambda: cast_mxfp4(jnp.ones((4, 4, 32))), ValueError, "x"),
    (lambda: cast_mxfp4(jnp.ones((48, 64)), columnwise=True), ValueError, "x"),
    (lambda: cast_mxfp4(jnp.ones((16, 32)), layout="gemm_b"), ValueError, "x"),
    (lambda: cast_mxfp4(jnp.ones((8, 64)), layout="gemm_b"), ValueError, "x"),
    (lambda: cast_mxfp4(jnp.ones((16, 64)), layout="shuffled"), ValueError, "layout"),
    (lambda: cast_mxfp4(jnp.ones((16, 64)), columnwise=1), TypeError, "columnwise"),
    (lambda: cast_mxfp4_dual(jnp.ones((16, 64)), layout_columnwise="gemm_b"), ValueError, "x"),
    (lambda: cast_mxfp4_dual(jnp.ones((32, 64)), hadamard_columnwise=64), ValueError, "hadamard_columnwise"),
    (lambda: cast_mxfp4(jnp.ones((32, 64)), index_offset=np.asarray([0, 16], np.uint32)), ValueError,
     "index_offset"),
    (lambda: cast_mxfp4(jnp.ones((32, 64)), index_offset=(0, 0)), TypeError, "index_offset"),
    (lambda: dequantize_mxfp4(jnp.ones((4, 16), jnp.int8), jnp.ones((4, 1), jnp.uint8)), TypeError, "data"),
    (lambda: dequantize_mxfp4(jnp.ones((4, 16), jnp.uint8), jnp.ones((4, 2), jnp.uint8)), ValueError, "scales"),
    (lambda: dequantize_mxfp4(jnp.ones((4, 15), jnp.uint8), jnp.ones((4, 1), jnp.uint8)), ValueError, "data"),
    (lambda: dequantize_mxfp4(jnp.ones((4, 16), jnp.uint8), jnp.ones((4, 1), jnp.uint8), jnp.int32), TypeError,
     "dtype"),
    (lambda: shuffle_fp4(jnp.ones((16, 48), jnp.uint8)), ValueError, "data"),
    (lambda: shuffle_scales(jnp.ones((16, 4), jnp.float32)), TypeError, "scales"),
    (lambda: unshuffle_scales(jnp.ones((256, 8), jnp.uint8), (300, 4)), ValueError, "scales"),
    (lambda: unshuffle_scales(jnp.ones((256, 8), jnp.uint8), 256), TypeError, "shape"),
])
def test_bad_arguments_are_named(call, error, name):
    with pytest.raises(error, match=rf"^{name}\b"):
        call()


# --- the native cast kernels (csrc/cpu/mxfp4.cc, csrc/gpu/mxfp4.cu) against the reference: bit-exact -----------
# On the CPU and, marked gpu, on a GPU: every dtype, option and layout, every finite bf16 and fp16 pattern under
# several block scales, NaN/Inf/zero/subnormal blocks, shapes that leave partial kernel tiles, and hypothesis-drawn
# shapes and values.

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def assert_same_bytes(native, reference, what=""):
    for i, (a, b) in enumerate(zip(jax.tree.leaves(native), jax.tree.leaves(reference), strict=True)):
        assert a.dtype == b.dtype == np.uint8 and a.shape == b.shape, (what, i, a.shape, b.shape)
        if not np.array_equal(a, b):
            bad = np.argwhere(a != b)
            raise AssertionError(f"{what} output {i}: {len(bad)} bytes differ, first at {bad[:4].tolist()}: "
                                 f"native {a[tuple(bad[0])]:#04x}, reference {b[tuple(bad[0])]:#04x}")


def tricky_matrix(m, k, dtype, seed=0):
    """Rows of very different magnitudes, plus NaN, +-Inf, zero, subnormal and exact-tie blocks."""
    rng = np.random.default_rng(seed)
    top = min(40, int(ml_dtypes.finfo(dtype).maxexp) - 4)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-top, top, (m, 1)))
    x[0, :12] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.1, -5.0, 7.0, -7.5]  # ties and saturation
    x[1, 3] = np.nan
    x[2, k - 1] = np.inf
    x[3, 5] = -np.inf
    x[4, :32] = 0.0
    x[5, :] = -0.0
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    x[6, :] = rng.integers(-300, 300, k) * tiny
    x[7, : k // 2] *= 2.0 ** -120
    # Blocks with amax 2^-122 (e = -124) holding subnormals in [2^-130, 2^-126): nearest rounding makes them 0,
    # stochastic rounding rounds them up with probability 1/32..1/2. A CPU that flushes subnormal inputs must
    # not lose them.
    x[8, :] = rng.choice([-1, 1], k) * rng.integers(2 ** 19, 2 ** 23, k) * 2.0 ** -149
    x[8, ::32] = 2.0 ** -122
    return jnp.asarray(x.astype(np.float32)).astype(dtype)


def dual_cast(x, **options):
    return cast_mxfp4_dual(x, **options)


# One case per line; together they take every value of every option, on every dtype.
OPTION_CASES = [
    (jnp.bfloat16, dict()),
    (jnp.bfloat16, dict(scale_rule="floor", sr_key=7, hadamard_rowwise=16, hadamard_columnwise=32, hadamard_key=3,
                        layout_rowwise="gemm_a", layout_columnwise="gemm_b", index_offset=(64, 96))),
    (jnp.bfloat16, dict(scale_rule="ceil", hadamard_rowwise=32, layout_rowwise="gemm_b")),
    (jnp.float16, dict(scale_rule="even", sr_key=123456789012, hadamard_columnwise=16, hadamard_key=5,
                       layout_columnwise="gemm_a", index_offset=(32, 0))),
    (jnp.float16, dict(scale_rule="floor", hadamard_rowwise=32, hadamard_columnwise=16)),
    (jnp.float32, dict(scale_rule="ceil", sr_key=11, layout_rowwise="gemm_a", layout_columnwise="gemm_a",
                       index_offset=(0, 64))),
    (jnp.float32, dict(hadamard_rowwise=16, hadamard_columnwise=32, hadamard_key=9, sr_key=1,
                       layout_rowwise="gemm_b", layout_columnwise="gemm_b")),
    # Round to nearest with only the columnwise copy rotated (the GPU's rotated-columns kernel; the default
    # recipe's wgrad operands): both sizes, with and without keyed signs, every dtype.
    (jnp.bfloat16, dict(hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="gemm_a")),
    (jnp.bfloat16, dict(scale_rule="floor", hadamard_columnwise=32, hadamard_key=3, layout_columnwise="gemm_b",
                        index_offset=(64, 32))),
    (jnp.float16, dict(scale_rule="ceil", hadamard_columnwise=16, hadamard_key=5)),
    (jnp.float32, dict(hadamard_columnwise=32, layout_rowwise="gemm_b")),
    # Stochastic rounding without rotated rows (the GPU's plain and rotated-columns kernels in their stochastic
    # form; the recipes with stochastic gradients): every dtype, both kernels.
    (jnp.bfloat16, dict(sr_key=5, layout_rowwise="gemm_a", layout_columnwise="gemm_b", index_offset=(64, 32))),
    (jnp.bfloat16, dict(scale_rule="floor", sr_key=2 ** 40 + 3, hadamard_columnwise=16, hadamard_key=6,
                        layout_rowwise="gemm_a", layout_columnwise="gemm_a")),
    (jnp.float16, dict(scale_rule="ceil", sr_key=9, index_offset=(0, 32))),
    (jnp.float32, dict(sr_key=13, hadamard_columnwise=16)),
]


@pytest.mark.parametrize("dtype, options", OPTION_CASES,
                         ids=[f"{np.dtype(d).name}-{i}" for i, (d, _) in enumerate(OPTION_CASES)])
def test_dual_cast_options_bit_exact(device, dtype, options):
    options = dict(options)
    if "index_offset" in options:
        options["index_offset"] = jnp.asarray(options["index_offset"], jnp.uint32)
    # 320 columns: a partial 256-column tile for 16-bit types; 96 rows: a partial 64-row tile, except where the
    # columnwise copy is shuffled (its quantization axis, M, must then be a multiple of 64).
    m = 192 if options.get("layout_columnwise") == "gemm_b" else 96
    x = jax.device_put(tricky_matrix(m, 320, dtype), device)
    native, reference = _oracle.native_and_reference(dual_cast, x, **options)
    assert_same_bytes(native, reference, str(options))


# One case per GPU kernel family, which write the padding at different points (csrc/gpu/mxfp4.cuh).
PADDING_CASES = [dict(), dict(sr_key=5, hadamard_columnwise=16), dict(hadamard_rowwise=16, hadamard_key=3)]


@pytest.mark.parametrize("options", PADDING_CASES, ids=["plain", "stochastic-rotated-columns", "general"])
def test_shuffled_scale_padding_is_zero_over_stale_memory(device, options):
    """A shuffled copy's scales are allocated in whole tiles that no block fills; the cast itself must write 0 to
    the rest, whatever the buffer held before. The scale buffers here are donated inputs full of 0xff (jit gives
    an output the buffer of a donated input of its shape; keep_unused keeps the inputs), so padding left unwritten
    shows up as 0xff."""
    x = jax.device_put(tricky_matrix(192, 320, jnp.bfloat16), device)
    options = dict(options, layout_rowwise="gemm_a", layout_columnwise="gemm_b")
    reference = _oracle.native_and_reference(dual_cast, x, **options)[1]
    stale = [jax.device_put(np.full(copy[1].shape, 0xFF, np.uint8), device) for copy in reference]
    with use_backend("native"), warnings.catch_warnings():
        warnings.simplefilter("error")  # jit warns of a donation no output can take
        native = jax.jit(lambda x, *_: dual_cast(x, **options), donate_argnums=(1, 2),
                         keep_unused=True)(x, *stale)
    assert_same_bytes(jax.tree.map(np.asarray, native), reference)


# Single copies whose rows end inside a 32-row group of the shuffled scales, which no dual cast meets (its rows are
# multiples of 32 both ways): the padding rows of that group and the padding columns beside its real rows.
SINGLE_PADDING_CASES = [((200, 320), dict(layout="gemm_a")),
                        ((192, 208), dict(columnwise=True, layout="gemm_b")),
                        ((200, 320), dict(layout="gemm_a", hadamard=16, hadamard_key=3))]


@pytest.mark.parametrize("shape, options", SINGLE_PADDING_CASES, ids=["rowwise", "columnwise", "rowwise-general"])
def test_partial_scale_group_padding_is_zero_over_stale_memory(device, shape, options):
    x = jax.device_put(tricky_matrix(*shape, jnp.bfloat16), device)
    reference = _oracle.native_and_reference(cast_mxfp4, x, **options)[1]
    stale = jax.device_put(np.full(reference[1].shape, 0xFF, np.uint8), device)
    with use_backend("native"), warnings.catch_warnings():
        warnings.simplefilter("error")  # jit warns of a donation no output can take
        native = jax.jit(lambda x, _: cast_mxfp4(x, **options), donate_argnums=(1,), keep_unused=True)(x, stale)
    assert_same_bytes(jax.tree.map(np.asarray, native), reference)


# Copies written as their values (layout "values", the A operands of gemm_bf16_fp4): one case per kernel path
# (round to nearest and stochastic, rotated columns, the general path with rotated rows), every dtype.
VALUES_CASES = [
    (jnp.bfloat16, dict()),
    (jnp.bfloat16, dict(hadamard_columnwise=16)),
    (jnp.bfloat16, dict(scale_rule="floor", sr_key=7, hadamard_rowwise=16, hadamard_key=3)),
    (jnp.float16, dict(scale_rule="ceil", hadamard_columnwise=32, hadamard_key=5)),
    (jnp.float32, dict(sr_key=11)),
    (jnp.float32, dict(hadamard_columnwise=16)),
    (jnp.bfloat16, dict(sr_key=4, hadamard_columnwise=16)),
]


@pytest.mark.parametrize("dtype, options", VALUES_CASES,
                         ids=[f"{np.dtype(d).name}-{i}" for i, (d, _) in enumerate(VALUES_CASES)])
def test_values_layout_writes_the_dequantized_copy(device, dtype, options):
    """Each copy in layout "values" is bf16 [rows, cols]: the numpy oracle's dequantization of the packed copy
    the same cast writes in the plain layout, bit for bit, with the same scales; the other copy is unchanged."""
    x = jax.device_put(tricky_matrix(96, 320, dtype), device)
    packed = _oracle.native_and_reference(dual_cast, x, **options)
    for layouts in (("values", "values"), ("values", "plain"), ("gemm_a", "values")):
        valued = _oracle.native_and_reference(dual_cast, x, **options, layout_rowwise=layouts[0],
                                              layout_columnwise=layouts[1])
        for got, plain in zip(valued, packed, strict=True):
            for copy, layout, (data, scales) in zip(got, layouts, plain, strict=True):
                if layout != "values":
                    continue
                assert copy[0].dtype == jnp.bfloat16 and copy[0].shape == (data.shape[0], 2 * data.shape[1])
                want = oracle.dequantize(data, scales).astype(ml_dtypes.bfloat16)
                np.testing.assert_array_equal(copy[0].view(np.uint16), want.view(np.uint16), err_msg=str(layouts))
                np.testing.assert_array_equal(copy[1], scales)


@pytest.mark.parametrize("columnwise, layout, sr_key, hadamard", [
    (False, "gemm_b", 5, 16), (True, "plain", 5, 16), (True, "gemm_b", 5, 16), (True, "plain", None, 16),
    (False, "gemm_a", 5, 0), (True, "plain", 5, 0)])
def test_single_cast_bit_exact(device, columnwise, layout, sr_key, hadamard):
    x = jax.device_put(tricky_matrix(128, 192, jnp.bfloat16, seed=1), device)
    options = dict(columnwise=columnwise, layout=layout, sr_key=sr_key, hadamard=hadamard,
                   hadamard_key=2 if hadamard else None)
    assert_same_bytes(*_oracle.native_and_reference(cast_mxfp4, x, **options), str(options))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("options", [dict(hadamard_rowwise=16, hadamard_columnwise=32),
                                     dict(hadamard_rowwise=32, hadamard_columnwise=16, sr_key=3, hadamard_key=4),
                                     dict(hadamard_columnwise=16, hadamard_key=4)],
                         ids=["nearest", "stochastic-signed", "rotated-columns"])
def test_hadamard_cast_near_the_flush_bound(device, dtype, options):
    """Rotations skip their flushes when every non-zero input has |x| >= 2^-100 (mxfp4_codec.h,
    rotation_never_flushes). Rows whose smallest non-zero magnitude lies just above, at and below that bound,
    near-cancelling pairs (differences of one unit in the last place) and waves that mix both kinds of block
    give the reference's bytes."""
    rng = np.random.default_rng(12)
    m, k = 128, 256
    binades = rng.choice([-98, -99, -100, -101, -102, -126, 3], size=(m, 1))
    x = rng.choice([-1.0, 1.0], (m, k)) * rng.uniform(1.0, 2.0, (m, k)) * np.exp2(binades)
    x[::3, 1::2] = -x[::3, ::2] * (1 + 2.0 ** -7)  # pairs that nearly cancel in the first butterfly stage
    x[::5, 7] = 2.0 ** -100  # the bound itself
    x[1::5, 9] = np.nextafter(np.float32(2.0 ** -100), np.float32(0))  # one unit below it
    x[2::7, 4:12] = 0.0
    x = jax.device_put(jnp.asarray(x.astype(np.float32)).astype(dtype), device)
    assert_same_bytes(*_oracle.native_and_reference(dual_cast, x, **options), f"{np.dtype(dtype).name} {options}")


@pytest.mark.parametrize("hadamard", [0, 16])
@pytest.mark.parametrize("dtype", DTYPES)
def test_columnwise_cast_of_unaligned_rows(device, dtype, hadamard):
    # K = 37: rows are not whole 16-byte chunks, so the kernel loads element by element.
    x = jax.device_put(tricky_matrix(64, 37, dtype, seed=2), device)
    assert_same_bytes(*_oracle.native_and_reference(cast_mxfp4, x, columnwise=True, hadamard=hadamard),
                      f"{np.dtype(dtype).name} hadamard {hadamard}")


def every_finite_pattern(dtype):
    """Every finite value of a 16-bit dtype, each block led by an anchor that sets (or leaves) its scale."""
    patterns = np.arange(2 ** 16, dtype=np.uint16).view(dtype)
    finite = patterns[np.isfinite(patterns.astype(np.float32))]
    finite = np.concatenate([finite, np.zeros(-len(finite) % 31, dtype)]).reshape(-1, 31)
    biggest = float(ml_dtypes.finfo(dtype).max)
    anchors = [float(ml_dtypes.finfo(dtype).smallest_subnormal), 1.0, -1.75, 5.0, biggest]
    blocks = [np.concatenate([np.full((len(finite), 1), a, dtype), finite], axis=1) for a in anchors]
    x = np.concatenate(blocks)
    return np.concatenate([x, np.zeros((-len(x) % 32, 32), dtype)])  # whole blocks for the columnwise copy


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("rule", ["even", "floor", "ceil"])
@pytest.mark.parametrize("sr_key", [None, 3])
def test_every_finite_16bit_pattern(device, dtype, rule, sr_key):
    x = jax.device_put(jnp.asarray(every_finite_pattern(dtype)), device)
    assert_same_bytes(*_oracle.native_and_reference(dual_cast, x, scale_rule=rule, sr_key=sr_key),
                      f"{np.dtype(dtype).name} {rule} sr_key={sr_key}")


@pytest.mark.parametrize("size", [16, 32])
def test_every_finite_bf16_pattern_in_rotated_columns(device, size):
    """Every finite bf16 pattern through the columnwise copy's rotation: 32 consecutive rows of one column mix
    different patterns, so the rotated float32 values (which the GPU encodes after rounding them to odd at bf16
    precision) carry low bits of every kind."""
    x = every_finite_pattern(ml_dtypes.bfloat16).reshape(-1, 64)
    x = jax.device_put(jnp.asarray(np.concatenate([x, np.zeros((-len(x) % 64, 64), x.dtype)])), device)
    assert_same_bytes(*_oracle.native_and_reference(dual_cast, x, hadamard_columnwise=size, hadamard_key=1),
                      f"size {size}")


WORKED_BLOCK = [  # docs/mxfp4.md, "Kernel contract": x[i] = float32((i - 16) * 0.37), one rowwise block
    (dict(scale_rule="even"), 127, "ffefeededdccab991021435455666677"),
    (dict(scale_rule="floor"), 127, "ffefeededdccab991021435455666677"),
    (dict(scale_rule="even", sr_key=(1, 2)), 127, "ffefeeeeddccab990021434555656767"),
    (dict(scale_rule="even", hadamard=16, hadamard_key=(1, 2)), 128, "bd0ab10cae4ca14941ccc6429a212c9a"),
]


@pytest.mark.parametrize("options, scale, data", WORKED_BLOCK)
def test_documented_worked_block(device, options, scale, data):
    options = {k: jnp.asarray(v, jnp.uint32) if k.endswith("key") else v for k, v in options.items()}
    x = jax.device_put((jnp.arange(32, dtype=jnp.float32) - 16) * jnp.float32(0.37), device)[None]
    with use_backend("native"):
        got_data, got_scales = cast_mxfp4(x, **options)
    assert int(got_scales[0, 0]) == scale
    assert np.asarray(got_data)[0].tobytes().hex() == data


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_cast_hypothesis(device, data):
    dtype = data.draw(st.sampled_from(DTYPES))
    m = 32 * data.draw(st.integers(1, 3))
    k = 32 * data.draw(st.integers(1, 10))
    width = 32 if dtype == jnp.float32 else 16
    values = data.draw(hnp.arrays(np.float32, (m, k), elements=st.floats(width=width)))
    options = dict(scale_rule=data.draw(st.sampled_from(["even", "floor", "ceil"])),
                   sr_key=data.draw(st.sampled_from([None, 0, 2 ** 40 + 17])),
                   hadamard_rowwise=data.draw(st.sampled_from([0, 16, 32])),
                   hadamard_columnwise=data.draw(st.sampled_from([0, 16, 32])))
    x = jax.device_put(jnp.asarray(values).astype(dtype), device)
    assert_same_bytes(*_oracle.native_and_reference(dual_cast, x, **options), f"{np.dtype(dtype).name} {options}")


def test_native_cast_is_what_runs(device):
    """The forced native implementation lowers to the FFI target (not silently to the reference)."""
    x = jax.device_put(jnp.ones((32, 64), jnp.bfloat16), device)
    with use_backend("native"):
        assert "ja_cast_mxfp4" in jax.jit(lambda x: cast_mxfp4_dual(x)).lower(x).as_text()


def test_native_cast_errors_raise(device):
    """Calls the handler rejects raise an exception naming the problem and never crash the process."""
    bf16 = jnp.bfloat16
    x = jax.device_put(jnp.ones((4, 64), bf16), device)
    words = jax.device_put(jnp.zeros(2, jnp.uint32), device)
    out = jax.ShapeDtypeStruct
    cast = dict(rowwise=True, columnwise=False, scale_rule="even", stochastic=False, hadamard_rowwise=np.int32(0),
                hadamard_columnwise=np.int32(0), hadamard_signs=False, layout_rowwise="plain",
                layout_columnwise="plain")
    none = (out((0, 0), jnp.uint8), out((0, 0), jnp.uint8))
    good = (out((4, 32), jnp.uint8), out((4, 2), jnp.uint8), *none)
    with pytest.raises(jax.errors.JaxRuntimeError, match="scale_rule must be even, floor or ceil, got nearest"):
        _oracle.ffi_call_now("ja_cast_mxfp4", good, x, words, words, words, **{**cast, "scale_rule": "nearest"})
    with pytest.raises(jax.errors.JaxRuntimeError, match="hadamard_rowwise must be 0, 16 or 32"):
        _oracle.ffi_call_now("ja_cast_mxfp4", good, x, words, words, words, **{**cast, "hadamard_rowwise": np.int32(8)})
    with pytest.raises(jax.errors.JaxRuntimeError, match="not a multiple of 32"):
        _oracle.ffi_call_now("ja_cast_mxfp4", (out((4, 24), jnp.uint8), out((4, 1), jnp.uint8), *none), x[:, :48],
                             words, words, words, **cast)
    with pytest.raises(jax.errors.JaxRuntimeError, match="rowwise scales must have shape"):
        _oracle.ffi_call_now("ja_cast_mxfp4", (out((4, 32), jnp.uint8), out((4, 3), jnp.uint8), *none), x, words,
                             words, words, **cast)
    values = {**cast, "layout_rowwise": "values"}
    with pytest.raises(jax.errors.JaxRuntimeError, match="rowwise data must be bfloat16"):
        _oracle.ffi_call_now("ja_cast_mxfp4", (out((4, 64), jnp.uint8), out((4, 2), jnp.uint8), *none), x, words,
                             words, words, **values)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"rowwise data must have shape \[rows, cols\]"):
        _oracle.ffi_call_now("ja_cast_mxfp4", (out((4, 32), jnp.bfloat16), out((4, 2), jnp.uint8), *none), x,
                             words, words, words, **values)
    # The process is still healthy: a valid call works.
    with use_backend("native"):
        np.testing.assert_array_equal(np.asarray(cast_mxfp4(x)[1]), np.full((4, 2), 125, np.uint8))


def test_python_rejects_shapes_before_the_cast_kernel():
    """Shapes the kernels do not take never reach them: the public functions raise ValueError first."""
    with use_backend("native"):
        with pytest.raises(ValueError, match="multiple of 32"):
            cast_mxfp4(jnp.ones((48, 40), jnp.bfloat16))  # rowwise blocks run along K = 40
        with pytest.raises(ValueError, match="multiple of 32"):
            cast_mxfp4_dual(jnp.ones((40, 64), jnp.bfloat16))  # columnwise blocks run along M = 40
        with pytest.raises(ValueError, match="gemm_b"):
            cast_mxfp4(jnp.ones((24, 64), jnp.bfloat16), layout="gemm_b")


@pytest.mark.parametrize("impl", ["xla", "native"])
def test_no_gradient_flows_through_the_integer_cast_on_every_implementation(impl):
    """The casts return bytes (or, in layout "values", rounded values): reverse and forward mode both give zero,
    whichever implementation runs."""
    if impl == "native" and _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    x = jax.random.normal(jax.random.key(0), (32, 64))
    with use_backend(impl):
        grad = jax.grad(lambda x: dequantize_mxfp4(*quantize_mxfp4(x)).sum())(x)
        tangent = jax.jvp(lambda x: dequantize_mxfp4(*cast_mxfp4(x)).sum(), (x,), (x,))[1]
        values_grad = jax.grad(lambda x: cast_mxfp4(x, layout="values")[0].astype(jnp.float32).sum())(x)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)
    np.testing.assert_array_equal(np.asarray(values_grad), 0.0)
    assert float(tangent) == 0.0


# --- property-based (slow tier): native == reference byte for byte, malformed calls never crash ------------------

# (x shape, options): single casts (rowwise and columnwise) and dual casts, every scale rule, SR, Hadamard and
# layout, on shapes with one block, odd block counts and partial kernel tiles. A small pool keeps compiles few.
CAST_PROPERTY_SHAPES = [(1, 32), (3, 96), (32, 32), (33, 64), (64, 160), (5, 1024), (96, 64), (128, 128)]
CAST_PROPERTY_OPTIONS = [
    ("single", dict()),
    ("single", dict(scale_rule="floor", sr_key=3, hadamard=16)),
    ("single", dict(scale_rule="ceil", hadamard=32, hadamard_key=5, layout="gemm_a")),
    ("single", dict(columnwise=True, sr_key=2 ** 40 + 1, layout="gemm_b")),
    ("dual", dict()),
    ("dual", dict(scale_rule="floor", hadamard_rowwise=32, hadamard_columnwise=16, layout_rowwise="gemm_a",
                  layout_columnwise="gemm_b")),
    ("dual", dict(scale_rule="ceil", sr_key=11, hadamard_key=4, hadamard_rowwise=16, index_offset=(32, 64))),
]


def _cast_applies(shape, kind, options):
    rows, cols = shape
    views = [(rows, cols, options.get("layout", "plain"))] if kind == "single" and not options.get("columnwise") \
        else [(cols, rows, options.get("layout", "plain"))] if kind == "single" \
        else [(rows, cols, options.get("layout_rowwise", "plain")), (cols, rows, options.get("layout_columnwise",
                                                                                             "plain"))]
    return all(c % 32 == 0 and (layout != "gemm_b" or (r % 16 == 0 and c % 64 == 0)) for r, c, layout in views)


@functools.cache
def _jitted_cast(impl, kind, option_index):
    options = dict(CAST_PROPERTY_OPTIONS[option_index][1])
    if "index_offset" in options:
        options["index_offset"] = np.asarray(options["index_offset"], np.uint32)
    fn = cast_mxfp4 if kind == "single" else cast_mxfp4_dual

    def run(x):
        with use_backend(impl):
            return fn(x, **options)
    return jax.jit(run)


@pytest.mark.slow
@pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")
@settings(max_examples=4000, deadline=None, suppress_health_check=list(HealthCheck), phases=(Phase.generate,))
@given(data=st.data())
def test_native_casts_match_the_reference_byte_for_byte_on_generated_inputs(data):
    option_index = data.draw(st.integers(0, len(CAST_PROPERTY_OPTIONS) - 1))
    kind, options = CAST_PROPERTY_OPTIONS[option_index]
    shape = data.draw(st.sampled_from([s for s in CAST_PROPERTY_SHAPES if _cast_applies(s, kind, options)]))
    dtype = data.draw(st.sampled_from(sorted(_property.DTYPES)))
    x = data.draw(_property.values(dtype, shape))
    assert_same_bytes(jax.tree.map(np.asarray, _jitted_cast("native", kind, option_index)(x)),
                      jax.tree.map(np.asarray, _jitted_cast("xla", kind, option_index)(x)), f"{dtype} {kind} {options}")


@pytest.mark.slow
@pytest.mark.skipif(_native.load("cpu").problem is not None, reason="no CPU library built")
@settings(max_examples=8, deadline=None, phases=(Phase.generate,))
@given(data=st.data())
def test_malformed_cast_calls_raise_and_never_crash(data):
    """A well-formed ja_cast_mxfp4 call with one thing made wrong: an operand's or result's dtype or a dimension,
    a key of the wrong length, or an attribute out of range; 25 of them per child process."""
    cases = []
    for _ in range(25):
        m, k = 32 * data.draw(st.integers(1, 4)), 32 * data.draw(st.integers(1, 4))
        dtype = data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))
        words = [[2], "uint32"]
        case = {"target": "ja_cast_mxfp4", "inputs": [[[m, k], dtype], words, words, words],
                "outputs": [[[m, k // 2], "uint8"], [[m, k // 32], "uint8"], [[0, 0], "uint8"], [[0, 0], "uint8"]],
                "attrs": dict(rowwise=True, columnwise=False, scale_rule="even", stochastic=False,
                              hadamard_rowwise=0, hadamard_columnwise=0, hadamard_signs=False,
                              layout_rowwise="plain", layout_columnwise="plain")}
        what = data.draw(st.sampled_from(["x dtype", "key", "data", "scales", "unrequested", "rule", "hadamard",
                                          "layout", "nothing requested"]))
        if what == "x dtype":
            case["inputs"][0][1] = data.draw(st.sampled_from(["int32", "uint8"]))
        elif what == "key":
            case["inputs"][data.draw(st.integers(1, 3))] = [[data.draw(st.sampled_from([1, 3]))], "uint32"]
        elif what in ("data", "scales"):
            index = 0 if what == "data" else 1
            shape = case["outputs"][index][0]
            case["outputs"][index] = [[shape[0], shape[1] + 1], "uint8"]
        elif what == "unrequested":
            case["outputs"][2] = [[k, m // 2], "uint8"]
        elif what == "rule":
            case["attrs"]["scale_rule"] = "nearest"
        elif what == "hadamard":
            case["attrs"]["hadamard_rowwise"] = data.draw(st.sampled_from([8, -16, 64]))
        elif what == "layout":
            case["attrs"]["layout_rowwise"] = "gemm_c"
        else:
            case["attrs"]["rowwise"] = False
        cases.append(case)
    _property.malformed_calls_survive(cases)
