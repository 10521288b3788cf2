"""`gemm_fp8` (jax_aiter/gemm_fp8.py): forward and both gradients against a float64 oracle of the FP8 casts and
products, the scale rule on hand-made vectors, argument errors, transformations, FSDP on 8 virtual CPU devices,
and the float8 dot in the program lowered for CUDA (docs/fp8.md)."""

import math
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_aiter
from jax_aiter.gemm_fp8 import Fp8Recipe, gemm_fp8
from jax_aiter.ref import gemm_fp8 as ref

# The formats' largest finite values: E4M3 (no infinities, one NaN pattern) 1.75 * 2^8, E5M2 (IEEE-like) 1.75 * 2^15.
FMAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
SMALLEST_NORMAL_F32 = 2.0 ** -126
F32_UNIT = 2.0 ** -24
# Unit roundoff of each output dtype: a correctly rounded result is within this fraction of its exact value.
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": F32_UNIT}


# --- the float64 oracle --------------------------------------------------------------------------------------


def oracle_scale(x, fmt) -> np.float32:
    """Per-tensor current scaling as the rule states it, by search: the smallest power of two from float32's
    smallest normal up with amax <= fmax * scale (float64 arithmetic, exact here); NaN when amax is not finite."""
    amax = float(np.float32(np.max(np.abs(np.asarray(x, np.float64)), initial=0.0)))
    if not np.isfinite(amax):
        return np.float32(np.nan)
    scale = SMALLEST_NORMAL_F32
    while amax > FMAX[fmt] * scale:
        scale *= 2
    return np.float32(scale)


def oracle_quantize(x, scale, fmt) -> np.ndarray:
    """The float8 codes: x times the reciprocal of the scale (exact), saturated to +-fmax, rounded to nearest
    even by ml_dtypes."""
    scaled = np.asarray(x, np.float32) * (np.float32(1) / np.float32(scale))
    return np.clip(scaled, -FMAX[fmt], FMAX[fmt]).astype(getattr(ml_dtypes, fmt))


def oracle_cast(x, fmt):
    scale = oracle_scale(x, fmt)
    return oracle_quantize(x, scale, fmt), scale


def oracle_products(a, b, dy, recipe):
    """(exact value, sum of |terms|) of y = x.W^T, dx = g.W and dW = g^T.x, in float64, each from the float8
    codes of its two operands times their two scales."""
    k, n = a.shape[-1], b.shape[0]
    qx, sx = oracle_cast(a.reshape(-1, k), recipe.forward_format)
    qw, sw = oracle_cast(b, recipe.forward_format)
    qg, sg = oracle_cast(dy.reshape(-1, n), recipe.gradient_format)
    x, w, g = (np.asarray(q, np.float64) for q in (qx, qw, qg))
    scale = {"y": float(sx) * float(sw), "dx": float(sg) * float(sw), "dw": float(sg) * float(sx)}
    exact = {"y": x @ w.T, "dx": g @ w, "dw": g.T @ x}
    magnitude = {"y": np.abs(x) @ np.abs(w).T, "dx": np.abs(g) @ np.abs(w), "dw": np.abs(g).T @ np.abs(x)}
    terms = {"y": k, "dx": n, "dw": x.shape[0]}
    return {name: (exact[name] * scale[name], magnitude[name] * scale[name], terms[name]) for name in exact}


def assert_fp8_close(got, exact, magnitude, terms, dtype, float32_factor=1):
    """got = one rounding to ``dtype`` of a float32 sum of the exact products (float8 x float8 is exact in
    float32) times the float32 product of the two scales. Bound: the output rounding, plus float32 error of
    (terms - 1) additions and two multiplications (scale product, rescale), each at most 2^-24 of the sum of
    |terms| (recursive-summation bound, whatever the order), doubled for the output rounding of that error.
    ``float32_factor`` widens the float32 part for a GEMM that sums in less than float32 precision."""
    got = np.asarray(got, np.float64).reshape(exact.shape)
    float32_error = float32_factor * (terms + 1) * F32_UNIT * magnitude
    bound = UNIT[np.dtype(dtype).name] * np.abs(exact) + 2 * float32_error
    excess = np.abs(got - exact) - bound
    assert np.all(excess <= 0), f"worst excess {np.max(excess)} at {np.unravel_index(np.argmax(excess), excess.shape)}"


def random(seed, shape, dtype, scale=1.0):
    return (scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)).astype(dtype)


# --- forward and gradients against the oracle -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("gradient_format", ref.FORMATS)
def test_forward_and_gradients_match_the_oracle(dtype, gradient_format):
    recipe = Fp8Recipe(gradient_format=gradient_format)
    # Operands of different magnitudes, so each scale matters; a leading batch axis, and K, N not multiples of 16.
    a, b, dy = random(0, (2, 24, 72), dtype, 3.0), random(1, (40, 72), dtype, 0.02), random(2, (2, 24, 40), dtype)
    y, vjp = jax.vjp(lambda a, b: gemm_fp8(a, b, recipe), a, b)
    dx, dw = vjp(dy)
    assert (y.shape, y.dtype, dx.shape, dx.dtype, dw.shape, dw.dtype) == ((2, 24, 40), dtype, a.shape, dtype,
                                                                          b.shape, dtype)
    expected = oracle_products(np.asarray(a), np.asarray(b), np.asarray(dy), recipe)
    for name, got in (("y", y), ("dx", dx), ("dw", dw)):
        assert_fp8_close(got, *expected[name], dtype)


def test_inputs_of_different_dtypes():
    """a in bf16, a float32 weight: each is cast from its own dtype; y and dx in bf16, dW in float32."""
    a, b, dy = random(3, (32, 64), jnp.bfloat16), random(4, (16, 64), jnp.float32), random(5, (32, 16), jnp.bfloat16)
    y, vjp = jax.vjp(gemm_fp8, a, b)
    dx, dw = vjp(dy)
    assert (y.dtype, dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.bfloat16, jnp.float32)
    expected = oracle_products(np.asarray(a), np.asarray(b), np.asarray(dy), Fp8Recipe())
    for name, got, dtype in (("y", y, jnp.bfloat16), ("dx", dx, jnp.bfloat16), ("dw", dw, jnp.float32)):
        assert_fp8_close(got, *expected[name], dtype)


def test_the_casts_are_the_oracles_codes():
    """The float8 codes themselves, bit for bit, for both formats and all three input dtypes."""
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
        x = random(6, (64, 96), dtype, 5.0)
        for fmt in ref.FORMATS:
            scale = jax.jit(ref.current_scale, static_argnums=1)(x, fmt)
            codes = jax.jit(ref.quantize, static_argnums=2)(x, scale, fmt)
            want_codes, want_scale = oracle_cast(np.asarray(x), fmt)
            assert np.float32(scale) == want_scale
            assert codes.dtype == np.dtype(getattr(ml_dtypes, fmt))
            np.testing.assert_array_equal(np.asarray(codes).view(np.uint8), want_codes.view(np.uint8))


# --- the scale rule, by hand -------------------------------------------------------------------------------------


def cast(x, fmt="float8_e4m3fn"):
    x = jnp.asarray(x, jnp.float32)
    scale = ref.current_scale(x, fmt)
    return float(scale), np.asarray(ref.quantize(x, scale, fmt)).astype(np.float64)


def test_format_maxima():
    assert {fmt: ref.format_max(fmt) for fmt in ref.FORMATS} == FMAX


def test_scale_is_the_smallest_power_of_two_that_holds_amax():
    # amax 3 <= 448 * 2^-7 = 3.5: scale 2^-7, and every code is exact (128, 384, 256).
    scale, codes = cast([1.0, -3.0, 2.0])
    assert scale == 2.0 ** -7
    np.testing.assert_array_equal(codes, [128.0, -384.0, 256.0])
    # amax 3.6 > 3.5: one binade up, scale 2^-6; 3.6 * 64 = 230.4 rounds to 224 (E4M3 steps of 16 in [128, 256)).
    scale, codes = cast([1.0, -3.6])
    assert scale == 2.0 ** -6
    np.testing.assert_array_equal(codes, [64.0, -224.0])
    # E5M2: 3 <= 57344 * 2^-14 = 3.5.
    scale, codes = cast([3.0, 1.0], "float8_e5m2")
    assert scale == 2.0 ** -14
    np.testing.assert_array_equal(codes, [49152.0, 16384.0])


def test_a_value_at_the_format_max_gives_scale_one():
    scale, codes = cast([448.0, -1.0, 0.5])
    assert scale == 1.0
    np.testing.assert_array_equal(codes, [448.0, -1.0, 0.5])
    scale, codes = cast([57344.0, -2.0, 3.0], "float8_e5m2")
    assert scale == 1.0
    np.testing.assert_array_equal(codes, [57344.0, -2.0, 3.0])
    # Just above fmax: the next power of two, and the amax element lands at 224.5 -> 224.
    scale, codes = cast([449.0, 1.0])
    assert scale == 2.0
    np.testing.assert_array_equal(codes, [224.0, 0.5])


def test_the_amax_element_lands_in_the_formats_top_binade():
    """For every amax the scale is a power of two and amax / scale lies in (fmax / 2, fmax]: no element
    saturates and at most one binade of the format goes unused."""
    rng = np.random.default_rng(7)
    for magnitude in rng.uniform(-20, 20, 40):
        x = (rng.standard_normal(64) * 2.0 ** magnitude).astype(np.float32)
        amax = float(np.max(np.abs(x)))
        for fmt in ref.FORMATS:
            scale, codes = cast(x, fmt)
            assert math.frexp(scale)[0] == 0.5
            assert FMAX[fmt] / 2 < amax / scale <= FMAX[fmt]
            assert np.max(np.abs(codes)) <= FMAX[fmt]


def test_zero_tensor_gets_the_smallest_normal_scale_and_zero_codes():
    scale, codes = cast(np.zeros(8))
    assert scale == SMALLEST_NORMAL_F32
    np.testing.assert_array_equal(codes, 0.0)
    y, vjp = jax.vjp(gemm_fp8, jnp.zeros((4, 32), jnp.bfloat16), random(8, (8, 32), jnp.bfloat16))
    dx, dw = vjp(random(9, (4, 8), jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(y, np.float32), 0.0)
    np.testing.assert_array_equal(np.asarray(dw, np.float32), 0.0)
    assert np.all(np.isfinite(np.asarray(dx, np.float32)))


def test_tiny_tensor_uses_the_scale_floor():
    # 2^-120 / 448 is below float32's smallest normal: the scale is 2^-126 and the code 2^-120 / 2^-126 = 64.
    scale, codes = cast([2.0 ** -120, 0.0])
    assert scale == SMALLEST_NORMAL_F32
    np.testing.assert_array_equal(codes, [64.0, 0.0])


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_amax_gives_a_nan_scale_and_nan_products(bad):
    scale, _ = cast([1.0, bad, 2.0])
    assert np.isnan(scale)
    a = jnp.ones((4, 32), jnp.bfloat16).at[1, 3].set(bad)
    y = gemm_fp8(a, jnp.ones((8, 32), jnp.bfloat16))
    assert np.all(np.isnan(np.asarray(y, np.float32)))


def test_quantize_saturates_instead_of_overflowing():
    """Values beyond fmax * scale become +-fmax: E4M3 would otherwise give NaN, E5M2 inf."""
    x = jnp.asarray([500.0, -1000.0, 10.0, 464.0], jnp.float32)
    np.testing.assert_array_equal(np.asarray(ref.quantize(x, 1.0, "float8_e4m3fn"), np.float64),
                                  [448.0, -448.0, 10.0, 448.0])
    x = jnp.asarray([70000.0, -1e9, 3.0], jnp.float32)
    np.testing.assert_array_equal(np.asarray(ref.quantize(x, 1.0, "float8_e5m2"), np.float64),
                                  [57344.0, -57344.0, 3.0])


# --- the recipe and bad input ----------------------------------------------------------------------------------


def test_recipe_is_a_static_hashable_value():
    assert Fp8Recipe.default() == Fp8Recipe() and hash(Fp8Recipe.default()) == hash(Fp8Recipe())
    assert (Fp8Recipe().forward_format, Fp8Recipe().gradient_format) == ("float8_e4m3fn", "float8_e5m2")
    assert Fp8Recipe(gradient_format="float8_e4m3fn") != Fp8Recipe()
    a, b = random(10, (8, 32), jnp.bfloat16), random(11, (16, 32), jnp.bfloat16)
    jitted = jax.jit(gemm_fp8, static_argnums=2)
    np.testing.assert_array_equal(jitted(a, b, Fp8Recipe()), gemm_fp8(a, b))


@pytest.mark.parametrize("call, error, name", [
    (lambda: gemm_fp8(jnp.ones((4, 8), jnp.int32), jnp.ones((2, 8))), TypeError, "a must have dtype"),
    (lambda: gemm_fp8(jnp.ones((4, 8)), jnp.ones((2, 8), jnp.float8_e4m3fn)), TypeError, "b must have dtype"),
    (lambda: gemm_fp8(jnp.ones(()), jnp.ones((2, 8))), ValueError, "a must have rank >= 1"),
    (lambda: gemm_fp8(jnp.ones((4, 8)), jnp.ones((2, 1, 8))), ValueError, "b must have rank 2"),
    (lambda: gemm_fp8(jnp.ones((4, 8)), jnp.ones((2, 7))), ValueError, "b must be"),
    (lambda: gemm_fp8(jnp.ones((4, 8)), [[1.0] * 8] * 2), TypeError, "b must be an array"),
    (lambda: gemm_fp8(jnp.ones((4, 8)), jnp.ones((2, 8)), "e4m3"), TypeError, "recipe must be an Fp8Recipe"),
    (lambda: Fp8Recipe(gradient_format="e5m2"), ValueError, "gradient_format must be one of"),
    (lambda: Fp8Recipe(gradient_format=jnp.float8_e5m2), ValueError, "gradient_format must be one of"),
])
def test_bad_input_names_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()


# --- transformations, selection and lowering -------------------------------------------------------------------


def test_jit_and_grad_equal_the_eager_vjp():
    a, b, dy = random(12, (3, 16, 64), jnp.bfloat16), random(13, (32, 64), jnp.bfloat16), \
        random(14, (3, 16, 32), jnp.bfloat16)
    y, vjp = jax.vjp(gemm_fp8, a, b)
    eager = (y, *vjp(dy))

    def loss(a, b):
        return jnp.sum(gemm_fp8(a, b).astype(jnp.float32) * dy.astype(jnp.float32))

    jitted = (jax.jit(gemm_fp8)(a, b), *jax.jit(jax.grad(loss, argnums=(0, 1)))(a, b))
    for got, want in zip(jitted, eager, strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_info_lists_the_op_and_what_runs_on_gpus():
    lines = [line for line in jax_aiter.info().splitlines() if " gemm_fp8 " in f" {line} "]
    assert len(lines) == 3
    assert any("cuda" in line and "cuBLASLt" in line for line in lines)


def _dots(text):
    """Every dot_general of a lowered program as (lhs, rhs, result type). An operand is named by where its
    values come from: ``f8E4M3FN`` a float8 array itself, ``f32(f8E4M3FN)`` its conversion to float32; reshapes
    and transposes are looked through. Values are looked up in the function (the custom-partitioned bodies are
    functions of their own) that holds the dot."""
    dots = []
    for body in text.split("func.func")[1:]:
        defs = dict(re.findall(r"^\s*(%\w+) = (.*)$", body, flags=re.M))

        def origin(name):
            rhs = defs.get(name, "")
            if m := re.match(r"stablehlo\.convert (%\w+) : \(tensor<[\dx]*x(\w+)>\) -> tensor<[\dx]*x(\w+)>", rhs):
                return f"{m.group(3)}({origin(m.group(1))})"
            if m := re.match(r"stablehlo\.(?:reshape|transpose) (%\w+)", rhs):
                return origin(m.group(1))
            types = re.findall(rf"{re.escape(name)}: tensor<[\dx]*x(\w+)>", body)
            return types[0] if types else rhs

        for lhs, rhs, out in re.findall(r"stablehlo\.dot_general (%\w+), (%\w+),.*-> tensor<[\dx]*x(\w+)>", body):
            dots.append((origin(lhs), origin(rhs), out))
    return sorted(dots)


def _training_step(a, b, dy):
    y, vjp = jax.vjp(gemm_fp8, a, b)
    return (y, *vjp(dy))


@pytest.mark.parametrize("dtype, result", [(jnp.bfloat16, "bf16"), (jnp.float32, "f32"), (jnp.float16, "f32")])
def test_gpu_programs_hand_xla_its_fp8_gemm_patterns(dtype, result):
    """Lowered without a GPU. CUDA and ROCm: fprop E4M3 x E4M3, dgrad and wgrad E5M2 x E4M3, each a dot of the
    float8 operands themselves with results in bfloat16 for bfloat16 outputs (else float32): XLA's pattern for an
    FP8 GEMM that writes the result type (the scale multiplied after it is folded in). CPU: the exact reference,
    float8 values upcast to float32, float32 results."""
    args = (jax.ShapeDtypeStruct((2, 64, 128), dtype), jax.ShapeDtypeStruct((256, 128), dtype),
            jax.ShapeDtypeStruct((2, 64, 256), dtype))
    traced = jax.jit(_training_step).trace(*args)
    e4m3, e5m2 = "f8E4M3FN", "f8E5M2"
    pairs = [(e4m3, e4m3), (e5m2, e4m3), (e5m2, e4m3)]
    for platform in ("cuda", "rocm"):
        assert _dots(traced.lower(lowering_platforms=(platform,)).as_text()) == sorted(
            (a, b, result) for a, b in pairs), platform
    assert _dots(traced.lower(lowering_platforms=("cpu",)).as_text()) == sorted(
        (f"f32({a})", f"f32({b})", "f32") for a, b in pairs)


def _compiled_gemms(hlo):
    """Every GEMM of a compiled GPU program as (where it runs, its two operands' element types): cuBLAS calls
    (the types of the instructions that define their first two operands) and Triton GEMM fusions (the types of
    the fused computation's first two parameters)."""
    types = dict(re.findall(r"^\s*(%[\w.-]+) = \(?(\w+)\[", hlo, flags=re.M))
    gemms = [(target, types.get(a), types.get(b)) for a, b, target in re.findall(
        r'custom-call\((%[\w.-]+), (%[\w.-]+)[^\n]*custom_call_target="(__cublas[^"]*)"', hlo)]
    parameters = {name: re.findall(r"parameter_[\d.]+: (\w+)\[", args)
                  for name, args in re.findall(r"^(%[\w.-]+) \(([^\n]*)\) -> ", hlo, flags=re.M)}
    gemms += [("triton", *parameters[name][:2])
              for name in re.findall(r'calls=(%[\w.-]+)[^\n]*"kind":"__triton\w*gemm\w*"', hlo)]
    return sorted(gemms)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("gradient_format", ref.FORMATS)
def test_gpu_runs_three_fp8_gemms_within_the_oracles_bound(gradient_format, dtype):
    """On a CUDA GPU: XLA compiles fwd+bwd to three GEMMs on the float8 operands themselves (fprop E4M3 x E4M3,
    dgrad and wgrad gradient format x E4M3), each a cuBLASLt FP8 call or a Triton GEMM fusion, whichever XLA's
    autotuner picks, and no other GEMM; y, dx and dW meet the oracle's bound (one rounding of a float32 sum of the
    exact products). K, N and the token count are large enough for the GEMMs' tiles and float32 promotions.

    The bound's float32 part is doubled: between its promotions to float32, Hopper's FP8 tensor cores sum in fewer
    bits. Measured on an H200 (2026-12-03, jax 0.11.2, these inputs, the exact-scale rule with float32 results,
    three cuBLASLt GEMMs): y and dx within the float32 bound, dW over it in three of the four cases, the worst
    needing 1440 float32 units of sum|products| where the float32 bound allows 1026 (2 (terms + 1), 512 terms).
    With the power-of-two rule and bf16 results XLA ran fprop as a Triton fusion at 2048 x 2048 x 2048 and
    wgrad at this shape, and y at 2048 needed the doubled bound too (``benchmarks/results/
    fp8_bf16_result_2026-12-03``)."""
    gpu = jax.devices("gpu")[0]
    if "rocm" in gpu.client.platform_version.lower():
        pytest.skip("the program checked is XLA's CUDA rewrite")
    recipe = Fp8Recipe(gradient_format=gradient_format)
    a, b, dy = (jax.device_put(t, gpu) for t in (random(20, (512, 1024), dtype, 2.0),
                                                 random(21, (768, 1024), dtype, 0.03),
                                                 random(22, (512, 768), dtype)))

    def step(a, b, dy):
        y, vjp = jax.vjp(lambda a, b: gemm_fp8(a, b, recipe), a, b)
        return (y, *vjp(dy))

    compiled = jax.jit(step).lower(a, b, dy).compile()
    gemms = _compiled_gemms(compiled.as_text())
    e4m3, gradient = "f8e4m3fn", gradient_format.replace("float8_", "f8")
    assert sorted(operands for _, *operands in gemms) == sorted([[e4m3, e4m3], [gradient, e4m3],
                                                                 [gradient, e4m3]]), gemms
    assert all(where in ("__cublas$lt$matmul$f8", "triton") for where, *_ in gemms), gemms
    expected = oracle_products(np.asarray(a), np.asarray(b), np.asarray(dy), recipe)
    for name, got in zip(("y", "dx", "dw"), compiled(a, b, dy), strict=True):
        assert_fp8_close(got, *expected[name], dtype, float32_factor=2)


# --- FSDP on 8 virtual CPU devices ----------------------------------------------------------------------------

# name: (mesh shape, mesh axes, sharding of a[B, S, K], sharding of the weight [N, K]), as tests/test_sharding.py
LAYOUTS = {
    "fsdp8": ((8,), ("fsdp",), P("fsdp", None, None), P("fsdp", None)),
    "data4_x_fsdp2": ((4, 2), ("data", "fsdp"), P(("data", "fsdp"), None, None), P("fsdp", None)),
    "weight_n_and_k_split": ((4, 2), ("data", "fsdp"), P("data", "fsdp", None), P("data", "fsdp")),
}


@pytest.mark.multidevice
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fsdp_equals_unsharded(layout):
    shape, names, act_spec, weight_spec = LAYOUTS[layout]
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=jax.devices("cpu")[:math.prod(shape)])
    act, weight = NamedSharding(mesh, act_spec), NamedSharding(mesh, weight_spec)
    a, b, dy = random(15, (8, 16, 64), jnp.bfloat16), random(16, (64, 64), jnp.bfloat16, 0.1), \
        random(17, (8, 16, 64), jnp.bfloat16)
    compiled = jax.jit(_training_step, in_shardings=(act, weight, act),
                       out_shardings=(act, act, weight)).lower(a, b, dy).compile()
    sharded, unsharded = compiled(a, b, dy), jax.jit(_training_step)(a, b, dy)
    # The scales are global maxima, so both programs sum the same exact products: only the order of the float32
    # sums differs (wgrad: per token shard, then across the <= 8 shards, each partial rescaled first: up to 8
    # more roundings). Each float32 result is within E = (terms + 1 + 8) 2^-24 sum|products| of the exact value
    # (assert_fp8_close's bound), and each bf16 result within half a unit (2^-8 relative) of its float32 value:
    # |got - want| <= 2^-7 |want| + 2E, to first order; the factor 4 on E absorbs the second-order terms.
    expected = oracle_products(np.asarray(a), np.asarray(b), np.asarray(dy), Fp8Recipe())
    for got, want, name in zip(sharded, unsharded, ("y", "dx", "dw"), strict=True):
        _, magnitude, terms = expected[name]
        got, want = (np.asarray(t, np.float64).reshape(magnitude.shape) for t in (got, want))
        bound = 2.0 ** -7 * np.abs(want) + 4 * (terms + 1 + 8) * F32_UNIT * magnitude
        assert np.all(np.abs(got - want) <= bound), name

    collectives = []  # (op, dtype, element count) of every array a collective returns
    for line in compiled.as_text().splitlines():
        match = re.search(r"= (.+?) (all-gather|reduce-scatter|all-reduce)\(", line)
        if match:
            collectives += [(match.group(2), dtype, math.prod(int(d) for d in dims.split(",") if d))
                            for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1))]
    # Only the weight's float8 copy is gathered, whole, once for fprop and once for dgrad; never the bf16 weight.
    # XLA's CPU backend carries float8 collectives as f16 (exact); a GPU's are f8e4m3fn.
    gathers = [(dtype, size) for op, dtype, size in collectives if op == "all-gather"]
    assert {dtype for dtype, _ in gathers} <= {"f8e4m3fn", "f16"} and [size for _, size in gathers].count(64 * 64) == 2
    # The amaxes are all-reduced as float32 scalars. wgrad's float32 partials: reduce-scattered over the axes that
    # split both the tokens and the weight, all-reduced over the token axes that do not split the weight.
    reductions = [(op, dtype, size) for op, dtype, size in collectives if op != "all-gather"]
    assert reductions and all(dtype == "f32" for _, dtype, _ in reductions)
    assert any(size == 1 for _, _, size in reductions)
    token_axes, weight_axes = set(spec_axes(act_spec[:2])), set(spec_axes(weight_spec))
    assert any(op == "reduce-scatter" for op, _, _ in reductions) == bool(token_axes & weight_axes)
    assert any(op == "all-reduce" and size > 1 for op, _, size in reductions) == bool(token_axes - weight_axes)


def spec_axes(entries) -> tuple[str, ...]:
    """The mesh axes named by PartitionSpec entries."""
    return tuple(a for entry in entries if entry for a in ((entry,) if isinstance(entry, str) else entry))
