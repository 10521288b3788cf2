"""FP4 GEMMs, the object API and the MXFP4 linear layer: gemm_fp4 against float64 products of the oracle's
dequantized operands, gemm_fp4_bf16 and its gradients against the recipe computed by hand with the oracle, and
weights quantized ahead (quantize_weights) against the linear given the weights themselves."""

import dataclasses
import functools
import gc
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _oracle
import mxfp4_oracle as oracle
from _programs import cast_calls
import jax_aiter
from jax_aiter import _native
from jax_aiter.gemm_fp4 import (CHECKPOINT_NAMES, MXFP4Quantizer, Mxfp4Copies, Mxfp4Recipe, Mxfp4Tensor,
                                Mxfp4Weight, WeightWorkspace, cast_mxfp4, cast_mxfp4_dual, gemm_fp4, gemm_fp4_bf16,
                                quantize_weights, shuffle_fp4, shuffle_scales)
from jax_aiter.gemm_fp4._gemm import gemm_bf16_fp4, gemm_fp4_plain_b
from jax_aiter.gemm_fp4._linear import role_sr_key
from jax_aiter.native import mxfp4 as native_mxfp4
from jax_aiter.ref import mxfp4 as mxfp4_ref

M, N, K = 40, 64, 128  # M is not a multiple of 32, 64 or 256: every padding path runs


def random_mxfp4(rng, rows, cols, scale_low=110, scale_high=140):
    codes = rng.integers(0, 16, (rows, cols)).astype(np.uint8)
    return oracle.pack(codes), rng.integers(scale_low, scale_high, (rows, cols // 32)).astype(np.uint8)


def assert_gemm_close(got, a_values, b_values):
    """|got - exact| <= half a bf16 ulp (2^-8) of the exact value plus float32 summation error, K - 1 additions
    of products exact in float32 (K, not K - 1, absorbs the rounding's 1 + 2^-8); exact in float64."""
    exact = a_values @ b_values.T
    magnitude = np.abs(a_values) @ np.abs(b_values).T
    bound = 2.0 ** -8 * np.abs(exact) + a_values.shape[1] * 2.0 ** -24 * magnitude
    err = np.abs(np.asarray(got, np.float64) - exact)
    assert np.all(err <= bound), float(np.max(err - bound))


# --- gemm_fp4 ---------------------------------------------------------------------------------------------


def test_gemm_fp4_matches_float64_product_of_dequantized_operands():
    rng = np.random.default_rng(0)
    a, a_scale = random_mxfp4(rng, M, K)
    b, b_scale = random_mxfp4(rng, N, K)
    out = gemm_fp4(jnp.asarray(a), shuffle_fp4(jnp.asarray(b)), shuffle_scales(jnp.asarray(a_scale)),
                   shuffle_scales(jnp.asarray(b_scale)))
    assert out.shape == (M, N) and out.dtype == jnp.bfloat16
    assert_gemm_close(out, oracle.dequantize(a, a_scale), oracle.dequantize(b, b_scale))


def test_gemm_fp4_on_cast_outputs():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    a, a_scale = cast_mxfp4(x, layout="gemm_a")
    b, b_scale = cast_mxfp4(w, layout="gemm_b")
    want_a = oracle.dequantize(*oracle.quantize(np.asarray(x, np.float32)))
    want_b = oracle.dequantize(*oracle.quantize(np.asarray(w, np.float32)))
    assert_gemm_close(gemm_fp4(a, b, a_scale, b_scale), want_a, want_b)


# --- the emulated GEMM: exact bf16 operands on matrix units vs float32 -----------------------------------


def test_every_mxfp4_value_is_a_bf16_value():
    """dequantize_bf16 is exact for all 256 bytes under all 256 scale bytes: the bf16 pattern is the float32
    pattern's high half, and the low half is zero (subnormals, infinities and NaN included)."""
    data = np.tile(np.arange(256, dtype=np.uint8), (256, 1))
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 256 * 2 // 32, axis=1)
    f32 = np.asarray(jax.jit(mxfp4_ref.dequantize)(data, scales)).view(np.uint32)
    bf16 = np.asarray(jax.jit(mxfp4_ref.dequantize_bf16)(data, scales)).view(np.uint16)
    assert np.all(f32 & 0xFFFF == 0)
    np.testing.assert_array_equal(bf16, (f32 >> 16).astype(np.uint16))
    with np.errstate(over="ignore"):  # 6 * 2^127 is Inf in float32
        np.testing.assert_array_equal(f32.view(np.float32), oracle.dequantize(data, scales).astype(np.float32))


EMULATIONS = {"dispatched": gemm_fp4, "float32": mxfp4_ref.gemm_fp4_float32,
              "bf16 operands": mxfp4_ref.gemm_fp4_bf16_operands}


def _emulated(device, rng, m, n, k, scale_low, scale_high):
    a, a_scale = random_mxfp4(rng, m, k, scale_low, scale_high)
    b, b_scale = random_mxfp4(rng, n, k, scale_low, scale_high)
    operands = [jax.device_put(t, device) for t in (a, shuffle_fp4(jnp.asarray(b)),
                                                    shuffle_scales(jnp.asarray(a_scale)),
                                                    shuffle_scales(jnp.asarray(b_scale)))]
    outs = {name: np.asarray(jax.jit(fn)(*operands), np.float64) for name, fn in EMULATIONS.items()}
    return outs, oracle.dequantize(a, a_scale), oracle.dequantize(b, b_scale)


def test_emulated_gemm_is_bitwise_exact_where_sums_are_exact(device):
    """Scale bytes 126..128 and K = 2048: every product is a multiple of 2^-4 and every partial sum stays below
    2^24 of those units, so every summation order gives the exact sum: each emulation returns it rounded once."""
    outs, a_values, b_values = _emulated(device, np.random.default_rng(11), 64, 48, 2048, 126, 129)
    exact = (a_values @ b_values.T).astype(np.float32).astype(jnp.bfloat16).astype(np.float64)
    for name, out in outs.items():
        np.testing.assert_array_equal(out, exact, err_msg=name)


@pytest.mark.parametrize("scale_low, scale_high", [(100, 160), (1, 70)], ids=["wide", "subnormal products"])
def test_emulated_gemm_is_bounded_elsewhere(device, scale_low, scale_high):
    """Anywhere else the emulations differ from the exact product by float32 summation error and one bf16
    rounding; where products fall below 2^-126 (scale bytes summing under 130) by at most K * 2^-126 more."""
    k = 1024
    outs, a_values, b_values = _emulated(device, np.random.default_rng(12), 40, 64, k, scale_low, scale_high)
    exact = a_values @ b_values.T
    magnitude = np.abs(a_values) @ np.abs(b_values).T
    bound = 2.0 ** -8 * np.abs(exact) + k * 2.0 ** -24 * magnitude + k * 2.0 ** -126 + 2.0 ** -133
    for name, out in outs.items():
        err = np.abs(out - exact)
        assert np.all(err <= bound), (name, float(np.max(err - bound)))


def test_emulated_gemm_non_finite_values(device):
    """NaN scales and infinite values (code 7 under scale byte 254 is 6 * 2^127) give the same NaN and Inf
    positions in every emulation."""
    rng = np.random.default_rng(13)
    m, n, k = 32, 32, 256
    codes_a, codes_b = rng.integers(0, 7, (m, k)), rng.integers(0, 7, (n, k))
    a_scale = np.full((m, k // 32), 120, np.uint8)
    b_scale = np.full((n, k // 32), 120, np.uint8)
    a_scale[3, 2] = 255  # row 3 is NaN
    a_scale[5, 1], codes_a[5, 40] = 254, 7  # row 5 holds +Inf
    b_scale[7, 0], codes_b[7, 3] = 254, 15  # column 7 holds -Inf
    a, b = oracle.pack(codes_a.astype(np.uint8)), oracle.pack(codes_b.astype(np.uint8))
    operands = [jax.device_put(t, device) for t in (a, shuffle_fp4(jnp.asarray(b)),
                                                    shuffle_scales(jnp.asarray(a_scale)),
                                                    shuffle_scales(jnp.asarray(b_scale)))]
    outs = {name: np.asarray(jax.jit(fn)(*operands), np.float64) for name, fn in EMULATIONS.items()}
    with np.errstate(invalid="ignore", over="ignore"):
        # float32 operands: 6 * 2^127 overflows to Inf there, as in every emulation
        exact = (oracle.dequantize(a, a_scale).astype(np.float32).astype(np.float64)
                 @ oracle.dequantize(b, b_scale).astype(np.float32).astype(np.float64).T)
    assert np.isnan(exact).any() and np.isinf(exact).any()
    for name, out in outs.items():
        np.testing.assert_array_equal(np.isnan(out), np.isnan(exact), err_msg=name)
        np.testing.assert_array_equal(np.isposinf(out), np.isposinf(exact), err_msg=name)
        np.testing.assert_array_equal(np.isneginf(out), np.isneginf(exact), err_msg=name)


@pytest.mark.parametrize("call, error, name", [
    (lambda a, b, sa, sb: gemm_fp4(a.astype(jnp.int8), b, sa, sb), TypeError, "a"),
    (lambda a, b, sa, sb: gemm_fp4(a, b[:, :32], sa, sb), ValueError, "b"),
    (lambda a, b, sa, sb: gemm_fp4(a, b, sa, sb[:128]), ValueError, "b_scale"),
    (lambda a, b, sa, sb: gemm_fp4(a, b[:40], sa, sb), ValueError, "b"),
    (lambda a, b, sa, sb: gemm_fp4(a[:, :48], b[:, :48], sa, sb), ValueError, "a"),
    (lambda a, b, sa, sb: gemm_fp4(a, b, sa[:, :4], sb), ValueError, "a_scale"),
    (lambda a, b, sa, sb: gemm_fp4(a, b, sa, sb[None]), ValueError, "b_scale"),
])
def test_gemm_fp4_bad_arguments_are_named(call, error, name):
    rng = np.random.default_rng(2)
    a, a_scale = random_mxfp4(rng, M, K)
    b, b_scale = random_mxfp4(rng, N, K)
    with pytest.raises(error, match=rf"^{name}\b"):
        call(jnp.asarray(a), jnp.asarray(b), shuffle_scales(jnp.asarray(a_scale)), shuffle_scales(jnp.asarray(b_scale)))


# --- the native emulation: ja_dequantize_mxfp4 (csrc/cpu/mxfp4.cc, csrc/gpu/mxfp4.cu) and the same dot ------


@pytest.mark.parametrize("layout, rows, cols", [("plain", 296, 544), ("gemm_a", 296, 544), ("gemm_b", 272, 576)])
def test_native_dequantize_every_byte_under_every_scale(device, layout, rows, cols):
    """Bit for bit the reference's bf16 of the unshuffled operand. Each row holds all 256 bytes in its first 16
    blocks, under scale bytes (row + block) % 256, so every byte meets every scale byte (NaN blocks, Inf,
    subnormals, signed zeros); the shapes leave partial kernel tiles in both directions, and M is ragged."""
    rng = np.random.default_rng(20)
    data = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    data[:, :256] = np.arange(256, dtype=np.uint8)
    blocks = cols // 32
    scales = ((np.arange(rows)[:, None] + np.arange(blocks)[None, :]) % 256).astype(np.uint8)
    want = np.asarray(jax.jit(mxfp4_ref.dequantize_bf16)(data, scales)).view(np.uint16)
    operands = [jax.device_put(t, device) for t in mxfp4_ref.to_layout(jnp.asarray(data), jnp.asarray(scales), layout)]
    got = jax.jit(native_mxfp4.dequantize_bf16, static_argnames="layout")(*operands, layout=layout)
    assert got.dtype == jnp.bfloat16 and got.shape == (rows, cols)
    got = np.asarray(got).view(np.uint16)
    bad = np.argwhere(got != want)
    assert not len(bad), f"{len(bad)} values differ, first at {bad[:4].tolist()}: {got[tuple(bad[0])]:#06x} " \
                         f"instead of {want[tuple(bad[0])]:#06x}"


@pytest.mark.parametrize("m", [40, 256])
def test_native_gemm_fp4_is_the_bf16_operand_emulation_bit_for_bit(device, m):
    """The same exact bf16 operands, then the same dot: the same bits, NaN and Inf included."""
    rng = np.random.default_rng(21)
    a, a_scale = random_mxfp4(rng, m, 256, 100, 160)
    b, b_scale = random_mxfp4(rng, 48, 256, 100, 160)
    a_scale[3, 2], b_scale[5, 1] = 255, 254  # a NaN block, and a block whose code 7 is Inf in float32
    operands = [jax.device_put(t, device) for t in (a, shuffle_fp4(jnp.asarray(b)), shuffle_scales(jnp.asarray(a_scale)),
                                                    shuffle_scales(jnp.asarray(b_scale)))]
    got = np.asarray(jax.jit(native_mxfp4.gemm_fp4)(*operands)).view(np.uint16)
    want = np.asarray(jax.jit(mxfp4_ref.gemm_fp4_bf16_operands)(*operands)).view(np.uint16)
    np.testing.assert_array_equal(got, want)


def operands_with_a_nan_block(device, impl, seed, nan_row):
    """A [40, 256] and B [48, 256] (codes packed, plain scales), B's row nan_row with one 0xFF scale; skips the
    native implementation on the CPU, which has none (its emulation multiplies in float32)."""
    if device.platform == "cpu" and impl == "native":
        pytest.skip("the CPU has no native FP4 GEMM: its emulation multiplies in float32")
    rng = np.random.default_rng(seed)
    a, a_scale = random_mxfp4(rng, 40, 256, 100, 160)
    b, b_scale = random_mxfp4(rng, 48, 256, 100, 160)
    b_scale[nan_row, nan_row % 8] = 255
    return a, a_scale, b, b_scale


@pytest.mark.parametrize("impl", ["native", "xla"])
def test_plain_b_gives_the_bits_of_the_shuffled_b(device, impl):
    """gemm_fp4_plain_b (the linear's residual copies as B) equals gemm_fp4 on the same B shuffled, bit for bit,
    NaN block included; on the CPU the float32 emulation, on GPUs the forced implementation."""
    a, a_scale, b, b_scale = operands_with_a_nan_block(device, impl, 23, 7)
    a, a_scale = jax.device_put(jnp.asarray(a), device), jax.device_put(shuffle_scales(jnp.asarray(a_scale)), device)
    plain = [jax.device_put(jnp.asarray(t), device) for t in (b, b_scale)]
    shuffled = [jax.device_put(t, device) for t in (shuffle_fp4(jnp.asarray(b)), shuffle_scales(jnp.asarray(b_scale)))]
    with jax_aiter.use_backend(gemm_fp4=impl):
        got = jax.jit(gemm_fp4_plain_b)(a, plain[0], a_scale, plain[1])
        want = jax.jit(gemm_fp4)(a, shuffled[0], a_scale, shuffled[1])
    assert got.devices() == {device}
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    assert np.isnan(np.asarray(got, np.float32)[:, 7]).all()


@pytest.mark.parametrize("impl", ["native", "xla"])
@pytest.mark.parametrize("b_layout", ["gemm_b", "plain"])
def test_bf16_a_gives_the_bits_of_the_packed_a(device, impl, b_layout):
    """gemm_bf16_fp4 with A's exact values equals gemm_fp4 with A packed, bit for bit (the same values, the same
    dot: on the CPU the float32 emulation, on GPUs the forced implementation), a NaN block of B included; and
    within the float64 bound of the exact product."""
    a, a_scale, b, b_scale = operands_with_a_nan_block(device, impl, 29, 5)
    a_values = jnp.asarray(oracle.dequantize(a, a_scale).astype(jnp.bfloat16))
    if b_layout == "gemm_b":
        b_operand, b_scale_operand = shuffle_fp4(jnp.asarray(b)), shuffle_scales(jnp.asarray(b_scale))
    else:
        b_operand, b_scale_operand = jnp.asarray(b), jnp.asarray(b_scale)
    put = functools.partial(jax.device_put, device=device)
    with jax_aiter.use_backend(gemm_fp4=impl, gemm_bf16_fp4=impl):
        got = jax.jit(functools.partial(gemm_bf16_fp4, b_layout=b_layout))(
            put(a_values), put(b_operand), put(b_scale_operand))
        packed = gemm_fp4 if b_layout == "gemm_b" else gemm_fp4_plain_b
        want = jax.jit(packed)(put(jnp.asarray(a)), put(b_operand), put(shuffle_scales(jnp.asarray(a_scale))),
                               put(b_scale_operand))
    assert got.devices() == {device}
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    assert np.isnan(np.asarray(got, np.float32)[:, 5]).all()
    finite = [c for c in range(48) if c != 5]
    assert_gemm_close(np.asarray(got, np.float64)[:, finite], oracle.dequantize(a, a_scale),
                      oracle.dequantize(b, b_scale)[finite])


@pytest.mark.parametrize("call, match", [
    (lambda: gemm_bf16_fp4(jnp.zeros((32, 64), jnp.float32), jnp.zeros((16, 32), jnp.uint8),
                           jnp.zeros((256, 8), jnp.uint8)), "a must"),
    (lambda: gemm_bf16_fp4(jnp.zeros((32, 64), jnp.bfloat16), jnp.zeros((16, 16), jnp.uint8),
                           jnp.zeros((256, 8), jnp.uint8)), "b must be"),
    (lambda: gemm_bf16_fp4(jnp.zeros((32, 64), jnp.bfloat16), jnp.zeros((16, 32), jnp.uint8),
                           jnp.zeros((16, 2), jnp.uint8)), "b_scale must have shape"),
    (lambda: gemm_bf16_fp4(jnp.zeros((32, 64), jnp.bfloat16), jnp.zeros((16, 32), jnp.uint8),
                           jnp.zeros((16, 2), jnp.uint8), b_layout="gemm_a"), "b_layout"),
    (lambda: gemm_bf16_fp4(jnp.zeros((32, 32), jnp.bfloat16), jnp.zeros((16, 16), jnp.uint8),
                           jnp.zeros((256, 8), jnp.uint8)), "gemm_b"),
])
def test_bf16_a_arguments_are_checked_by_name(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()


def test_gpu_training_step_casts_rowwise_a_operands_to_values():
    """Lowered for CUDA (where gemm_fp4 emulates): the casts write the rowwise copies of x and g (fprop's and
    dgrad's A operands) as bf16 values, so only wgrad's A operand (g's columnwise copy) and the B operands are
    dequantized: W's rowwise copy (shuffled) and the columnwise copies of W and x in the plain layout they are
    kept in (nothing shuffles them to be unshuffled)."""
    x, w = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16), jax.ShapeDtypeStruct((64, 256), jnp.bfloat16)

    def step(x, w):
        y, vjp = jax.vjp(gemm_fp4_bf16, x, w)
        return y, vjp(y)

    with jax_aiter.use_backend("native"):
        text = jax.jit(step).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()

    def attribute(target, name):
        return sorted(re.search(name + r' = "(\w+)"', line).group(1) for line in text.splitlines()
                      if f"custom_call @{target}(" in line)

    assert attribute(native_mxfp4.DEQUANTIZE_TARGET, "layout") == ["gemm_a", "gemm_b", "plain", "plain"]
    assert attribute(native_mxfp4.TARGET, "layout_rowwise") == ["gemm_b", "values", "values"]
    assert attribute(native_mxfp4.TARGET, "layout_columnwise") == ["gemm_a", "plain", "plain"]


def test_plain_b_scales_are_checked_by_name():
    a, b = jnp.zeros((32, 128), jnp.uint8), jnp.zeros((64, 128), jnp.uint8)
    a_scale = jnp.zeros(mxfp4_ref.padded_scale_shape(32, 8), jnp.uint8)
    with pytest.raises(ValueError, match=r"b_scale must be the plain scales of \[64, 8\], shape \(64, 8\)"):
        gemm_fp4_plain_b(a, b, a_scale, jnp.zeros(mxfp4_ref.padded_scale_shape(64, 8), jnp.uint8))


def test_native_gemm_fp4_runs_on_gpus_and_the_cpu_keeps_float32():
    """Chosen for CUDA and ROCm (without aiter), never for the CPU, whose emulation multiplies in float32."""
    rng = np.random.default_rng(22)
    a, a_scale = random_mxfp4(rng, M, K)
    b, b_scale = random_mxfp4(rng, N, K)
    args = (jnp.asarray(a), shuffle_fp4(jnp.asarray(b)), shuffle_scales(jnp.asarray(a_scale)),
            shuffle_scales(jnp.asarray(b_scale)))
    names = [impl.name for impl in jax_aiter._backend.implementations("gemm_fp4")]
    assert names.index("native") == names.index("aiter") + 1 and names[-1] == "xla"
    impl = jax_aiter._backend.implementations("gemm_fp4")[names.index("native")]
    assert impl.platforms == ("cuda", "rocm") and impl.targets == (native_mxfp4.DEQUANTIZE_TARGET,)
    assert native_mxfp4.DEQUANTIZE_TARGET not in jax.jit(gemm_fp4).lower(*args).as_text()
    with jax_aiter.use_backend(gemm_fp4="native"):
        text = jax.jit(gemm_fp4).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count(native_mxfp4.DEQUANTIZE_TARGET) == 2


def test_native_dequantize_errors_raise(device):
    """Calls the handler rejects raise an exception naming the argument and never crash the process."""
    bf16, u8 = jnp.bfloat16, jnp.uint8
    out = jax.ShapeDtypeStruct
    data = jax.device_put(jnp.zeros((32, 64), u8), device)
    scales = jax.device_put(jnp.zeros((32, 4), u8), device)
    padded = jax.device_put(jnp.zeros((256, 8), u8), device)
    call = functools.partial(_oracle.ffi_call_now, native_mxfp4.DEQUANTIZE_TARGET)
    with pytest.raises(jax.errors.JaxRuntimeError, match="layout must be plain, gemm_a or gemm_b, got gemm_c"):
        call(out((32, 128), bf16), data, scales, layout="gemm_c")
    with pytest.raises(jax.errors.JaxRuntimeError, match="data must be a 2-D uint8 array"):
        call(out((32, 128), bf16), data.astype(jnp.int8), scales, layout="plain")
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"scales must have shape \[256, 8\]"):
        call(out((32, 128), bf16), data, scales, layout="gemm_a")
    with pytest.raises(jax.errors.JaxRuntimeError, match="data in layout gemm_b needs rows % 16 == 0"):
        call(out((24, 128), bf16), data[:24], padded, layout="gemm_b")
    with pytest.raises(jax.errors.JaxRuntimeError, match="multiple of 16 bytes per row"):
        call(out((32, 48), bf16), data[:, :24], scales[:, :1], layout="plain")
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"out must have shape \[32, 128\]"):
        call(out((32, 64), bf16), data, scales, layout="plain")
    with pytest.raises(jax.errors.JaxRuntimeError, match="out must be a 2-D bfloat16 array"):
        call(out((32, 128), jnp.float32), data, scales, layout="plain")
    # The process is still healthy: a valid call works (scale byte 0, code 0: +0).
    np.testing.assert_array_equal(np.asarray(call(out((32, 128), bf16), data, padded, layout="gemm_b"),
                                             np.float32), 0.0)


# --- recipe and quantizers --------------------------------------------------------------------------------


def test_recipe_presets_and_validation():
    default, peer = Mxfp4Recipe.default(), Mxfp4Recipe.gradient_hadamard()
    assert Mxfp4Recipe.peer_parity() == peer  # the 0.1.0 name stays as an alias
    assert default == Mxfp4Recipe()
    assert (default.fprop_hadamard, default.dgrad_hadamard, default.wgrad_hadamard) == (0, 0, 16)
    assert (peer.fprop_hadamard, peer.dgrad_hadamard, peer.wgrad_hadamard) == (0, 16, 16)
    for recipe in (default, peer):
        assert not recipe.uses_stochastic_rounding and recipe.hadamard_seed is None
        assert all(recipe.scale_rule(role) == "even" for role in ("activation", "weight", "gradient"))
    assert len({default, peer, Mxfp4Recipe.default()}) == 2  # hashable: usable as a static argument
    with pytest.raises(ValueError, match="^gradient_scale_rule"):
        Mxfp4Recipe(gradient_scale_rule="nearest")
    with pytest.raises(ValueError, match="^dgrad_hadamard"):
        Mxfp4Recipe(dgrad_hadamard=8)
    with pytest.raises(TypeError, match="^weight_stochastic"):
        Mxfp4Recipe(weight_stochastic=1)
    with pytest.raises(ValueError, match="^hadamard_seed"):
        Mxfp4Recipe(hadamard_seed=-1)


def test_quantizer_presets_follow_the_operand_table():
    recipe = Mxfp4Recipe(fprop_hadamard=32, dgrad_hadamard=16, wgrad_hadamard=0, weight_scale_rule="ceil",
                         gradient_stochastic=True, hadamard_seed=5)
    act, weight, grad = (MXFP4Quantizer.for_activation(recipe), MXFP4Quantizer.for_weight(recipe),
                         MXFP4Quantizer.for_grad(recipe))
    assert (act.rowwise_layout, act.columnwise_layout, act.rowwise_hadamard, act.columnwise_hadamard) == (
        "gemm_a", "gemm_b", 32, 0)
    assert (weight.rowwise_layout, weight.columnwise_layout, weight.rowwise_hadamard,
            weight.columnwise_hadamard, weight.scale_rule) == ("gemm_b", "gemm_b", 32, 16, "ceil")
    assert (grad.rowwise_layout, grad.columnwise_layout, grad.rowwise_hadamard, grad.columnwise_hadamard,
            grad.stochastic) == ("gemm_a", "gemm_a", 16, 0, True)
    assert {act.hadamard_seed, weight.hadamard_seed, grad.hadamard_seed} == {5}
    assert MXFP4Quantizer.for_weight() == MXFP4Quantizer.for_role("weight", Mxfp4Recipe.default())
    with pytest.raises(ValueError, match="^rowwise_layout and columnwise_layout"):
        MXFP4Quantizer(rowwise_layout=None)
    with pytest.raises(ValueError, match="^role"):
        MXFP4Quantizer.for_role("bias")
    with pytest.raises(TypeError, match="^recipe"):
        MXFP4Quantizer.for_weight("default")


def test_quantizer_output_is_a_pytree_of_copies_that_dequantize():
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((2, N // 2, K)), jnp.bfloat16)
    quantizer = MXFP4Quantizer(rowwise_layout="gemm_b", columnwise_layout="gemm_a", scale_rule="floor",
                               rowwise_hadamard=16, columnwise_hadamard=32, hadamard_seed=7)
    copies = quantizer.quantize(w)
    assert isinstance(copies, Mxfp4Copies) and isinstance(copies.rowwise, Mxfp4Tensor)
    row, col = copies
    assert (row.shape, row.axis, row.data_shuffled, row.scales_shuffled, row.hadamard) == ((2, 32, K), -1, True,
                                                                                           True, 16)
    assert (col.data.shape, col.axis, col.data_shuffled, col.scales_shuffled, col.hadamard) == ((K, N // 2), 0,
                                                                                                False, True, 32)
    leaves, tree = jax.tree.flatten(copies)
    assert len(leaves) == 6  # data, scales and sign key of each copy
    rebuilt = jax.jit(lambda c: c)(jax.tree.unflatten(tree, leaves))
    np.testing.assert_array_equal(rebuilt.columnwise.data, col.data)
    # dequantize() returns the logical tensor: the oracle's dequantized rotated values, rotated back.
    matrix = np.asarray(w, np.float32).reshape(N, K)
    signs_k, signs_m = oracle.hadamard_signs((7, 0), K), oracle.hadamard_signs((7, 0), N)
    expected_row = oracle.dequantize(*oracle.quantize(matrix, "floor", hadamard=16, hadamard_key=(7, 0)))
    expected_col = oracle.dequantize(*oracle.quantize(matrix.T, "floor", hadamard=32, hadamard_key=(7, 0)))
    unrotate = lambda v, size, signs: (v.reshape(v.shape[0], -1, size) @ oracle.sylvester_matrix(size)  # noqa: E731
                                       ).reshape(v.shape) * signs
    # The butterfly's sums of one block's FP4 values are exact in float32; so is the scale 1/4 of a 16-point
    # transform, while 1/sqrt(32) and the product by it round: 2^-23, plus the float64 oracle's own rounding where
    # its 32 scaled terms cancel (2^-40 is far above it and far below any FP4 step).
    np.testing.assert_array_equal(row.dequantize(), unrotate(expected_row, 16, signs_k).reshape(w.shape))
    np.testing.assert_allclose(col.dequantize(), unrotate(expected_col, 32, signs_m).T.reshape(w.shape),
                               rtol=2 ** -23, atol=2 ** -40)
    assert row.dequantize(jnp.bfloat16).dtype == jnp.bfloat16


def tile_test_matrix(rng, rows=128, cols=192):
    """Gaussian values, each 32 x 32 tile at its own magnitude (2^-130 to 2^20: subnormal tiles included), one tile
    with an infinity; the tile maxima land on E2M1 ties and on the 'even' rule's round-up."""
    magnitude = np.exp2(rng.integers(-130, 20, (rows // 32, 1, cols // 32, 1)).astype(np.float64))
    w = (rng.standard_normal((rows // 32, 32, cols // 32, 32)) * magnitude).reshape(rows, cols)
    w[0, 0], w[33, 40], w[64, 97] = 7.0 * 2 ** 3, 1.75 * 2 ** -5, np.inf
    return w.astype(np.float32)


@pytest.mark.parametrize("rule", ["even", "floor", "ceil"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["rne", "sr"])
def test_tile_scaling_is_the_oracle_and_both_copies_hold_it(rule, stochastic):
    rng = np.random.default_rng(11)
    w = tile_test_matrix(rng)
    sr_words = (5, 6) if stochastic else None
    sr_key = None if sr_words is None else np.asarray(sr_words, np.uint32)
    expected = oracle.quantize_tiles(w, rule, sr_words)
    got = mxfp4_ref.quantize_tiles(jnp.asarray(w), scale_rule=rule,
                                   sr_key=None if sr_words is None else jnp.asarray(sr_words, jnp.uint32))
    np.testing.assert_array_equal(np.asarray(got, np.float64), expected)
    assert np.isnan(expected[64:96, 96:128]).all() and not np.isnan(expected[:64]).any()
    quantizer = MXFP4Quantizer(rowwise_layout="gemm_b", columnwise_layout="gemm_b", scale_rule=rule,
                               stochastic=stochastic, tile_scaling=True)
    for impl in ("xla", "native"):
        if impl == "native" and _native.load("cpu").problem:
            continue
        with jax_aiter.use_backend(impl):
            row, col = quantizer.quantize(jnp.asarray(w), sr_key=sr_key)
        np.testing.assert_array_equal(np.asarray(row.dequantize(), np.float64), expected, err_msg=impl)
        np.testing.assert_array_equal(np.asarray(col.dequantize(), np.float64), expected, err_msg=impl)
    # Per-block scaling (the same quantizer without tiles) gives the two copies different values.
    row, col = dataclasses.replace(quantizer, tile_scaling=False).quantize(jnp.asarray(np.nan_to_num(w, posinf=0.0)),
                                                                           sr_key=sr_key)
    assert np.any(np.asarray(row.dequantize()) != np.asarray(col.dequantize()))


def test_tile_scaling_checks():
    with pytest.raises(ValueError, match="^weight_tile_scaling needs fprop_hadamard"):
        Mxfp4Recipe(weight_tile_scaling=True, dgrad_hadamard=16)
    with pytest.raises(TypeError, match="^weight_tile_scaling must be a bool"):
        Mxfp4Recipe(weight_tile_scaling=1)
    with pytest.raises(ValueError, match="^tile_scaling needs"):
        MXFP4Quantizer(rowwise_hadamard=16, tile_scaling=True)
    with pytest.raises(ValueError, match="^x: tile_scaling needs"):
        MXFP4Quantizer(tile_scaling=True).quantize(jnp.ones((48, 64)))
    tiles = Mxfp4Recipe(weight_tile_scaling=True)
    assert MXFP4Quantizer.for_weight(tiles).tile_scaling
    assert not MXFP4Quantizer.for_activation(tiles).tile_scaling and not MXFP4Quantizer.for_grad(tiles).tile_scaling


def test_quantizer_checks_its_key():
    with pytest.raises(ValueError, match="^sr_key"):
        MXFP4Quantizer(stochastic=True).quantize(jnp.ones((4, 32)))
    with pytest.raises(ValueError, match="^sr_key"):
        MXFP4Quantizer().quantize(jnp.ones((4, 32)), sr_key=1)


# --- weight workspace -------------------------------------------------------------------------------------


def test_workspace_serves_the_same_array_and_never_a_changed_one():
    rng = np.random.default_rng(4)
    quantizer = MXFP4Quantizer.for_weight()
    w = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    ws = WeightWorkspace()
    first = ws.get_or_quantize(w, quantizer, cache_name="w")
    assert ws.get_or_quantize(w, quantizer, cache_name="w") is first
    # An optimizer step makes a new array: requantized, equal to a fresh quantization.
    stepped = (w - 0.25 * jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)).astype(jnp.bfloat16)
    second = ws.get_or_quantize(stepped, quantizer, cache_name="w")
    assert np.any(np.asarray(second.rowwise.data) != np.asarray(first.rowwise.data))
    np.testing.assert_array_equal(second.rowwise.data, quantizer.quantize(stepped).rowwise.data)
    # Equal values in a different object, another quantizer or another SR key: requantized as well.
    assert ws.get_or_quantize(jnp.array(stepped), quantizer, cache_name="w") is not second
    other = dataclasses.replace(quantizer, scale_rule="floor")
    assert ws.get_or_quantize(stepped, other, cache_name="w").rowwise is not second.rowwise
    sr = dataclasses.replace(quantizer, stochastic=True)
    keyed = ws.get_or_quantize(stepped, sr, cache_name="w", sr_key=1)
    assert ws.get_or_quantize(stepped, sr, cache_name="w", sr_key=1) is keyed
    assert ws.get_or_quantize(stepped, sr, cache_name="w", sr_key=2) is not keyed
    # A collected weight's entry is dead even if a new array reuses its id.
    ws.get_or_quantize(stepped, quantizer, cache_name="w")
    del w, first, stepped, second
    gc.collect()
    fresh = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    np.testing.assert_array_equal(ws.get_or_quantize(fresh, quantizer, cache_name="w").columnwise.data,
                                  quantizer.quantize(fresh).columnwise.data)


def test_workspace_under_jit_quantizes_every_step():
    rng = np.random.default_rng(5)
    quantizer = MXFP4Quantizer.for_weight()
    ws = WeightWorkspace()

    @jax.jit
    def step(w):
        return ws.get_or_quantize(w, quantizer, cache_name="w").rowwise.data

    for _ in range(2):
        w = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
        np.testing.assert_array_equal(step(w), quantizer.quantize(w).rowwise.data)
    assert len(ws) == 0  # no tracer is kept


def test_workspace_without_a_name_is_keyed_by_the_weight_object():
    rng = np.random.default_rng(11)
    quantizer = MXFP4Quantizer.for_weight()
    w1 = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    w2 = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    ws = WeightWorkspace()
    first = ws.get_or_quantize(w1, quantizer)
    assert ws.get_or_quantize(w1, quantizer) is first
    second = ws.get_or_quantize(w2, quantizer)  # another array has its own entry, w1's stays
    assert second is not first and ws.get_or_quantize(w1, quantizer) is first
    np.testing.assert_array_equal(second.rowwise.data, quantizer.quantize(w2).rowwise.data)
    assert len(ws) == 2 and ws.keys() == [] and w1 in ws and w2 in ws
    assert jnp.array(w1) not in ws  # equal values, another object
    # A collected weight's entry goes with it.
    del w2, second
    gc.collect()
    assert len(ws) == 1


def test_workspace_names_evict_force_update_and_membership():
    rng = np.random.default_rng(12)
    quantizer = MXFP4Quantizer.for_weight()
    w = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    ws = WeightWorkspace()
    named = ws.get_or_quantize(w, quantizer, cache_name="mlp/up")
    assert "mlp/up" in ws and "mlp/down" not in ws and w in ws and ws.keys() == ["mlp/up"]
    # force_update quantizes anew (equal bytes, a new object) and the new copies are what is served next.
    forced = ws.get_or_quantize(w, quantizer, cache_name="mlp/up", force_update=True)
    assert forced is not named and ws.get_or_quantize(w, quantizer, cache_name="mlp/up") is forced
    np.testing.assert_array_equal(forced.columnwise.data, named.columnwise.data)
    unnamed = ws.get_or_quantize(w, quantizer)
    assert len(ws) == 2 and unnamed is not forced
    assert ws.evict("mlp/up") and "mlp/up" not in ws and not ws.evict("mlp/up")
    assert ws.get_or_quantize(w, quantizer, cache_name="mlp/up") is not forced  # requantized after eviction
    assert ws.evict(w) and len(ws) == 0 and w not in ws  # an array evicts every entry made from it
    with pytest.raises(TypeError, match="^cache_name"):
        ws.get_or_quantize(w, quantizer, cache_name=3)
    with pytest.raises(TypeError, match="^force_update"):
        ws.get_or_quantize(w, quantizer, force_update=1)
    with pytest.raises(TypeError, match="^key"):
        ws.evict(3)
    assert None not in ws and 3 not in ws


# --- gemm_fp4_bf16 ----------------------------------------------------------------------------------------


def operands_by_hand(a, b, dy, recipe, key_words):
    """The float64 operands (A, B) of fprop, dgrad and wgrad, each quantized by the oracle as the recipe says
    (token rows zero-padded to 64); every GEMM is then A . B^T."""
    x = np.asarray(a, np.float32).reshape(-1, K)
    w = np.asarray(b, np.float32)
    g = np.asarray(dy, np.float32).reshape(-1, N)
    padding = ((0, -x.shape[0] % 64), (0, 0))
    x, g = np.pad(x, padding), np.pad(g, padding)
    seed = recipe.hadamard_seed
    signs_key = None if seed is None else (seed & 0xFFFFFFFF, seed >> 32)

    def role_key(role):
        return tuple(int(v) for v in role_sr_key(key_words, role)) if recipe.stochastic(role) else None

    def piece(t, role, gemm, transposed):
        hadamard = recipe.hadamard(gemm)
        return oracle.dequantize(*oracle.quantize(t, recipe.scale_rule(role), role_key(role), transposed, hadamard,
                                                  signs_key if hadamard else None))

    if recipe.weight_tile_scaling:  # one quantized W for both GEMMs
        w_fprop = oracle.quantize_tiles(w, recipe.scale_rule("weight"), role_key("weight"))
        w_dgrad = w_fprop.T
    else:
        w_fprop, w_dgrad = piece(w, "weight", "fprop", False), piece(w.T, "weight", "dgrad", True)
    return {"fprop": (piece(x, "activation", "fprop", False), w_fprop),
            "dgrad": (piece(g, "gradient", "dgrad", False), w_dgrad),
            "wgrad": (piece(g.T, "gradient", "wgrad", True), piece(x.T, "activation", "wgrad", True))}


RECIPES = [
    Mxfp4Recipe.default(),
    Mxfp4Recipe(activation_scale_rule="floor", weight_scale_rule="ceil", activation_stochastic=True,
                gradient_stochastic=True, fprop_hadamard=32, dgrad_hadamard=16, wgrad_hadamard=16,
                hadamard_seed=0x1234567890),
    Mxfp4Recipe(weight_tile_scaling=True, weight_stochastic=True, wgrad_hadamard=32, hadamard_seed=3),
]


@pytest.mark.parametrize("recipe", RECIPES, ids=["default", "mixed", "weight-tiles"])
def test_gemm_fp4_bf16_forward_and_gradients_equal_the_recipe_by_hand(recipe):
    rng = np.random.default_rng(6)
    a = jnp.asarray(rng.standard_normal((2, M // 2, K)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((2, M // 2, N)), jnp.bfloat16)
    key = jax.random.key(42)

    @jax.jit
    def forward_and_vjp(a, b, dy):
        y, vjp = jax.vjp(lambda a, b: gemm_fp4_bf16(a, b, recipe, key=key), a, b)
        return (y, *vjp(dy))

    y, da, db = forward_and_vjp(a, b, dy)
    assert (y.dtype, da.dtype, db.dtype) == (jnp.bfloat16,) * 3
    operands = operands_by_hand(a, b, dy, recipe, jax.random.bits(key, (2,), jnp.uint32))
    (x_row, w_row), (g_row, w_col), (g_col, x_col) = operands["fprop"], operands["dgrad"], operands["wgrad"]
    assert_gemm_close(np.asarray(y).reshape(M, N), x_row[:M], w_row)
    assert_gemm_close(np.asarray(da).reshape(M, K), g_row[:M], w_col)
    assert_gemm_close(db, g_col, x_col)
    # Without differentiation only the rowwise copies are made; the forward value is the same.
    np.testing.assert_array_equal(jax.jit(lambda a, b: gemm_fp4_bf16(a, b, recipe, key=key))(a, b), y)
    # The Hadamard rotations are paired (one operand alone would scramble the product), so every GEMM stays as
    # accurate as FP4 allows against the unquantized float64 products.
    a64, b64, dy64 = (np.asarray(t, np.float64).reshape(-1, t.shape[-1]) for t in (a, b, dy))
    for got, exact in zip((y, da, db), (a64 @ b64.T, dy64 @ b64, dy64.T @ a64)):
        got = np.asarray(got, np.float64).reshape(exact.shape)
        # MXFP4 rounds Gaussian blocks with ~0.115 relative rms error, sqrt(2) more when stochastic (the variance
        # doubles); two copies add in quadrature: 0.16, 0.23 with both stochastic (measured 0.21); 0.25 sits just above.
        # A stochastic tile-scaled weight rounds with 0.18 (a tile's amax is above its rows'): 0.22 with an RNE copy.
        assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 0.25


def test_stochastic_gradients_depend_on_the_key_only():
    rng = np.random.default_rng(8)
    a = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    recipe = Mxfp4Recipe(gradient_stochastic=True)
    grad = jax.jit(jax.grad(lambda a, b, key: jnp.sum(gemm_fp4_bf16(a, b, recipe, key=key).astype(jnp.float32)
                                                     * jnp.arange(N)), argnums=(0, 1)))
    first = grad(a, b, jax.random.key(1))
    again = grad(a, b, jax.random.key(1))
    other = grad(a, b, jax.random.key(2))
    for x, y, z in zip(first, again, other):
        np.testing.assert_array_equal(x, y)
        assert np.any(np.asarray(x) != np.asarray(z))


def test_gemm_fp4_bf16_under_vmap_and_float32_inputs():
    rng = np.random.default_rng(9)
    a = jnp.asarray(rng.standard_normal((3, 8, K)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((N, K)), jnp.float32)
    mapped = jax.jit(jax.vmap(lambda t: gemm_fp4_bf16(t, b)))(a)
    np.testing.assert_array_equal(mapped, gemm_fp4_bf16(a, b))  # rowwise casts do not mix rows
    grad = jax.jit(jax.grad(lambda a, b: jnp.sum(gemm_fp4_bf16(a, b).astype(jnp.float32)), argnums=(0, 1)))
    da, db = grad(a, b)
    assert da.dtype == db.dtype == jnp.float32


@pytest.mark.parametrize("call, error, name", [
    (lambda a, b: gemm_fp4_bf16(a.astype(jnp.int32), b), TypeError, "a"),
    (lambda a, b: gemm_fp4_bf16(a, b[None]), ValueError, "b"),
    (lambda a, b: gemm_fp4_bf16(a, b[:, :64]), ValueError, "b"),
    (lambda a, b: gemm_fp4_bf16(a[:, :96], b[:, :96]), ValueError, "b"),
    (lambda a, b: gemm_fp4_bf16(a, b[:48]), ValueError, "b"),
    (lambda a, b: gemm_fp4_bf16(a, b, "default"), TypeError, "recipe"),
    (lambda a, b: gemm_fp4_bf16(a, b, Mxfp4Recipe(weight_stochastic=True)), ValueError, "key"),
    (lambda a, b: gemm_fp4_bf16(a, b, Mxfp4Recipe(weight_stochastic=True), key="k"), TypeError, "key"),
])
def test_gemm_fp4_bf16_bad_arguments_are_named(call, error, name):
    a, b = jnp.ones((M, K), jnp.bfloat16), jnp.ones((N, K), jnp.bfloat16)
    with pytest.raises(error, match=rf"^{name}\b"):
        call(a, b)


# --- rematerialization ------------------------------------------------------------------------------------


def _remat_variants():
    """value_and_grad of a loss through gemm_fp4_bf16: without remat, under plain jax.checkpoint (everything
    recomputed) and under a policy that saves the FP4 copies by name."""
    def loss(a, b):
        return jnp.sum(gemm_fp4_bf16(jnp.sin(a), b).astype(jnp.float32))

    policy = jax.checkpoint_policies.save_only_these_names(*CHECKPOINT_NAMES)
    return {name: jax.value_and_grad(fn, argnums=(0, 1)) for name, fn in (
        ("plain", loss), ("remat", jax.checkpoint(loss)), ("saved", jax.checkpoint(loss, policy=policy)))}


def test_checkpoint_names_keep_the_casts_out_of_the_recomputed_backward():
    """Forward: dual casts of x and W; backward: one dual cast of g. Plain remat re-runs the two forward casts
    for the residuals; saving the named copies does not, and no value changes."""
    assert CHECKPOINT_NAMES == ("mxfp4_activation", "mxfp4_weight")
    rng = np.random.default_rng(10)
    a = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    counts, values = {}, {}
    with jax_aiter.use_backend("xla"):
        for name, fn in _remat_variants().items():
            counts[name] = cast_calls(jax.make_jaxpr(fn)(a, b).jaxpr)
            values[name] = jax.jit(fn)(a, b)
    assert counts == {"plain": 3, "remat": 5, "saved": 3}
    for name in ("remat", "saved"):
        for got, want in zip(jax.tree.leaves(values[name]), jax.tree.leaves(values["plain"])):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_checkpoint_names_with_native_casts_in_the_compiled_program():
    """The same count on what XLA compiles: ja_cast_mxfp4 custom calls with the native casts forced."""
    if _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    a = jnp.ones((M, K), jnp.bfloat16)
    b = jnp.ones((N, K), jnp.bfloat16)
    counts = {}
    with jax_aiter.use_backend(cast_mxfp4="native", cast_mxfp4_dual="native"):
        for name, fn in _remat_variants().items():
            hlo = jax.jit(fn).lower(a, b).compile().as_text()
            counts[name] = hlo.count('custom_call_target="ja_cast_mxfp4"')
    assert counts == {"plain": 3, "remat": 5, "saved": 3}


# --- weights quantized once per step (quantize_weights) ---------------------------------------------------


def two_weight_model(recipe, ws, quantized_key=None):
    """A loss over two linears sharing x (N = 128 and 64): on the weights themselves, or on their
    ``quantize_weights`` copies (``ws`` then holds Mxfp4Weights)."""
    rng = np.random.default_rng(11)
    a = jnp.asarray(rng.standard_normal((2, M // 2, K)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((2, M // 2, 192)), np.float32)
    key = jax.random.key(5)

    def loss(a, ws):
        y = jnp.concatenate([gemm_fp4_bf16(a, ws["up"], recipe, key=key),
                             gemm_fp4_bf16(a, ws["gate"], recipe, key=jax.random.fold_in(key, 1))], axis=-1)
        return jnp.sum(y.astype(jnp.float32) * dy)

    return a, loss


def model_weights(rng, dtype=jnp.bfloat16):
    return {"up": jnp.asarray(rng.standard_normal((128, K)) * 0.1, dtype),
            "gate": jnp.asarray(rng.standard_normal((64, K)) * 0.1, dtype)}


QUANTIZE_RECIPES = {
    "default": Mxfp4Recipe.default(),
    "keyed": Mxfp4Recipe.keyed_hadamard(),
    "rotated-weights": Mxfp4Recipe(weight_scale_rule="ceil", fprop_hadamard=16, dgrad_hadamard=32, hadamard_seed=9),
    "weight-tiles": Mxfp4Recipe(weight_tile_scaling=True),
    "sr-activations-gradients": Mxfp4Recipe(activation_stochastic=True, gradient_stochastic=True),
}


@pytest.mark.parametrize("recipe", QUANTIZE_RECIPES.values(), ids=QUANTIZE_RECIPES.keys())
def test_quantized_weights_give_the_linears_outputs_and_gradients_bit_for_bit(recipe):
    """Loss, dx and dW through quantize_weights' copies are the bytes of passing the weights themselves: the same
    casts, only made ahead (and, where the recipe allows, for both weights in one launch)."""
    ws = model_weights(np.random.default_rng(12))
    a, loss = two_weight_model(recipe, ws)
    plain = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, ws)
    ahead = jax.jit(jax.value_and_grad(lambda a, ws: loss(a, quantize_weights(ws, recipe)), argnums=(0, 1)))(a, ws)
    assert jax.tree.structure(ahead) == jax.tree.structure(plain)
    for got, want in zip(jax.tree.leaves(ahead), jax.tree.leaves(plain)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_quantized_weight_copies_are_the_casts_of_each_weight():
    """Grouped by width or not, each Mxfp4Weight holds its own weight's plain dual cast (the public op, called
    on that weight alone) and the weight itself."""
    ws = model_weights(np.random.default_rng(13))
    ws["wide"] = jnp.asarray(np.random.default_rng(14).standard_normal((64, 256)), jnp.bfloat16)
    for recipe in (Mxfp4Recipe.default(), Mxfp4Recipe(weight_scale_rule="floor", dgrad_hadamard=16)):
        quantized = jax.jit(lambda ws: quantize_weights(ws, recipe))(ws)
        for name, w in ws.items():
            q = quantized[name]
            assert isinstance(q, Mxfp4Weight) and q.recipe == recipe and q.shape == w.shape
            np.testing.assert_array_equal(q.weight, w)
            (row_data, row_scales), (col_data, col_scales) = cast_mxfp4_dual(
                w, scale_rule=recipe.weight_scale_rule, hadamard_columnwise=recipe.dgrad_hadamard)
            for got, want in ((q.row_data, row_data), (q.row_scales, row_scales), (q.col_data, col_data),
                              (q.col_scales, col_scales)):
                np.testing.assert_array_equal(got, want)


def test_weights_of_one_width_share_one_cast():
    """Three weights of K = 128 and one of K = 256: two dual casts when the weight role rounds to nearest
    unrotated, one per weight otherwise."""
    rng = np.random.default_rng(15)
    ws = [jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
          for shape in ((128, K), (64, K), (192, K), (64, 256))]
    counts = {}
    with jax_aiter.use_backend("xla"):
        for name, recipe in (("default", Mxfp4Recipe.default()), ("rotated", Mxfp4Recipe(dgrad_hadamard=16))):
            counts[name] = cast_calls(jax.make_jaxpr(lambda ws: quantize_weights(ws, recipe))(ws).jaxpr)
    assert counts == {"default": 2, "rotated": 4}


def test_microbatches_cast_the_weights_once_and_accumulate_the_same_gradient():
    """Gradient accumulation over two microbatches: with the copies made once per step, the weights are cast once
    (not once per microbatch) and the summed loss and gradients are the bytes of the per-microbatch casts."""
    rng = np.random.default_rng(16)
    w = jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16)
    batches = jnp.asarray(rng.standard_normal((2, M, K)), jnp.bfloat16)

    def micro_loss(a, b):
        return jnp.sum(jnp.square(gemm_fp4_bf16(a, b).astype(jnp.float32)))

    def per_microbatch(w):
        return micro_loss(batches[0], w) + micro_loss(batches[1], w)

    def once_per_step(w):
        q = quantize_weights(w)
        return micro_loss(batches[0], q) + micro_loss(batches[1], q)

    with jax_aiter.use_backend("xla"):
        casts = {name: cast_calls(jax.make_jaxpr(jax.value_and_grad(fn))(w).jaxpr)
                 for name, fn in (("per microbatch", per_microbatch), ("once per step", once_per_step))}
    # Per microbatch: x's, W's and g's dual casts; made ahead, W's once for both.
    assert casts == {"per microbatch": 6, "once per step": 5}
    want, got = (jax.jit(jax.value_and_grad(fn))(w) for fn in (per_microbatch, once_per_step))
    for g, v in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(v))


def test_stochastic_weights_round_as_the_linear_with_the_key_folded_per_weight():
    """Weight i of the pytree rounds as gemm_fp4_bf16 rounds the weight itself given fold_in(key, i): the same
    copies, and the same loss and gradients."""
    recipe = Mxfp4Recipe(weight_stochastic=True)
    ws = model_weights(np.random.default_rng(17))
    key = jax.random.key(21)
    quantized = jax.jit(lambda ws, key: quantize_weights(ws, recipe, key=key))(ws, key)
    for i, name in enumerate(sorted(ws)):  # the pytree's leaf order
        words = jax.random.bits(jax.random.fold_in(key, i), (2,), jnp.uint32)
        (row_data, _), (col_data, _) = cast_mxfp4_dual(ws[name], sr_key=role_sr_key(words, "weight"))
        np.testing.assert_array_equal(quantized[name].row_data, row_data)
        np.testing.assert_array_equal(quantized[name].col_data, col_data)

    a = jnp.asarray(np.random.default_rng(19).standard_normal((M, K)), jnp.bfloat16)
    w = ws["up"]
    want = jax.value_and_grad(lambda a, w: jnp.sum(jnp.square(gemm_fp4_bf16(
        a, w, recipe, key=jax.random.fold_in(key, 0)).astype(jnp.float32))), argnums=(0, 1))(a, w)
    got = jax.value_and_grad(lambda a, w: jnp.sum(jnp.square(gemm_fp4_bf16(
        a, quantize_weights(w, recipe, key=key)).astype(jnp.float32))), argnums=(0, 1))(a, w)
    for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(v))
    other = quantize_weights(ws, recipe, key=jax.random.key(22))
    assert np.any(np.asarray(other["up"].row_data) != np.asarray(quantized["up"].row_data))


def test_quantized_weights_inference_and_float32_weight_gradient():
    rng = np.random.default_rng(18)
    a = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((N, K)), jnp.float32)
    np.testing.assert_array_equal(gemm_fp4_bf16(a, quantize_weights(w)), gemm_fp4_bf16(a, w))
    dw = jax.grad(lambda w: jnp.sum(gemm_fp4_bf16(a, quantize_weights(w)).astype(jnp.float32)))(w)
    assert dw.dtype == jnp.float32
    np.testing.assert_array_equal(dw, jax.grad(lambda w: jnp.sum(gemm_fp4_bf16(a, w).astype(jnp.float32)))(w))


def _bad_copies(field, shape):
    def call(a, b):
        q = quantize_weights(b)
        return gemm_fp4_bf16(a, dataclasses.replace(q, **{field: jnp.zeros(shape, jnp.uint8)}))
    return call


@pytest.mark.parametrize("call, error, name", [
    (lambda a, b: quantize_weights(b[None]), ValueError, "weights"),
    (lambda a, b: quantize_weights({"w": b, "v": b[:48]}), ValueError, r"weights\['v'\]: N"),
    (lambda a, b: quantize_weights(b.astype(jnp.int8)), TypeError, "weights"),
    (lambda a, b: quantize_weights({}), ValueError, "weights"),
    (lambda a, b: quantize_weights(b, "default"), TypeError, "recipe"),
    (lambda a, b: quantize_weights(b, Mxfp4Recipe(weight_stochastic=True)), ValueError, "key"),
    (lambda a, b: gemm_fp4_bf16(a, quantize_weights(b), Mxfp4Recipe(fprop_hadamard=16)), ValueError, "b"),
    (lambda a, b: gemm_fp4_bf16(a[:, :64], quantize_weights(b)), ValueError, "b"),
    (_bad_copies("row_scales", (N, K // 16)), ValueError, r"b\.row_scales"),
    (_bad_copies("col_data", (K, N)), ValueError, r"b\.col_data"),
])
def test_quantize_weights_bad_arguments_are_named(call, error, name):
    a, b = jnp.ones((M, K), jnp.bfloat16), jnp.ones((N, K), jnp.bfloat16)
    with pytest.raises(error, match=rf"^{name}\b"):
        call(a, b)
