"""Sharded == unsharded for the custom-partitioned GEMMs (jax_aiter/_partition.py) on 8 virtual CPU devices, or on
the GPUs where there are two or more (tests/_devices.py; 8, 4 or 2 of them): ``gemm_fp4_bf16`` and ``gemm`` under
FSDP layouts, forward and gradients, under ``jax.jit`` with NamedSharding in/out shardings, and the collectives in
the compiled HLO (docs/mxfp4.md, "Sharding")."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import _devices
import _oracle
import mxfp4_oracle as oracle
import jax_aiter
from jax_aiter import _native
from jax_aiter._partition import mesh_axes_of_dims
from jax_aiter.gemm import gemm
from jax_aiter.gemm_fp4 import Mxfp4Recipe, cast_mxfp4, dequantize_mxfp4, gemm_fp4_bf16
from jax_aiter.gemm_fp4 import _linear
from jax_aiter.gemm_fp4._linear import role_sr_key

pytestmark = pytest.mark.multidevice

# 8 blocks of 64 tokens and 8 blocks of 32 weight rows: the smallest shapes every layout below divides whole.
M, N, K = 512, 256, 128
# Stochastic rounding on every role and keyed Hadamard signs on every GEMM: each shard's bytes depend on the
# global indices of its elements, so a wrong index_offset changes them.
RECIPE = Mxfp4Recipe(activation_stochastic=True, weight_stochastic=True, gradient_stochastic=True,
                     fprop_hadamard=32, dgrad_hadamard=16, wgrad_hadamard=16, hadamard_seed=0x1234_5678_9ABC)
KEY = np.array([7, 11], np.uint32)

# The layouts' meshes: 8, 4 or 2 devices, the most there are (every shape here splits whole over 8 devices).
AVAILABLE = _devices.multidevice_devices()
SIZE = next((n for n in (8, 4, 2) if n <= len(AVAILABLE)), 0)
if SIZE == 0:
    pytest.skip(f"needs 2 or more devices, {len(AVAILABLE)} here", allow_module_level=True)
DEVICES = AVAILABLE[:SIZE]
HALF = SIZE // 2

# name: (mesh shape, mesh axes, sharding of the token axis, sharding of the weight [N, K])
FP4_LAYOUTS = {
    "fsdp": ((SIZE,), ("fsdp",), "fsdp", P("fsdp", None)),
    "data_x_fsdp2": ((HALF, 2), ("data", "fsdp"), ("data", "fsdp"), P("fsdp", None)),
    "tokens_on_data_weight_k_on_fsdp": ((2, HALF), ("data", "fsdp"), "data", P(None, "fsdp")),
}


def make_mesh(shape, names):
    """A mesh of this module's devices; a layout whose axes would not all split (2 devices for a 2-D layout)
    skips the test."""
    if min(shape) < 2:
        pytest.skip(f"the layout's mesh {shape} needs more than {SIZE} devices")
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=DEVICES)


def unsharded(fn, *args):
    """fn under jit on one device of the platform the meshes use."""
    with jax.default_device(DEVICES[0]):
        return jax.jit(fn)(*args)


def random_bf16(seed, shape):
    # Made on the CPU whatever the meshes use: the same bits everywhere (tests/test_multiprocess.py compares runs).
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        return np.asarray(jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(jnp.bfloat16))


def collectives(compiled) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """(op, [(dtype, shape) of each result]) for every all-gather, reduce-scatter and all-reduce."""
    found = []
    for line in compiled.as_text().splitlines():
        match = re.search(r"= (.+?) (all-gather|reduce-scatter|all-reduce)\(", line)
        if match:
            types = [(dtype, tuple(int(d) for d in dims.split(",") if d))
                     for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1))]
            found.append((match.group(2), types))
    return found


def assert_summation_order_close(got, want, a, b):
    """got and want are a @ b.T (float64 operands whose products are exact in float32) summed in float32 in two
    orders, each rounded once to bf16. Each sum is within (K - 1) 2^-24 sum|a_k b_k| of the exact value and each
    rounding within u = 2^-8 of its sum, so |got - want| <= 2^-7 |exact| + 2K 2^-24 sum|a_k b_k| (the (1 + u) on
    the sums' error fits in K vs K - 1)."""
    exact = a @ b.T
    bound = 2.0 ** -7 * np.abs(exact) + a.shape[1] * 2.0 ** -23 * (np.abs(a) @ np.abs(b).T)
    err = np.abs(_oracle.f64(got).reshape(exact.shape) - _oracle.f64(want).reshape(exact.shape))
    assert np.all(err <= bound), float(np.max(err / bound))


def fp4_step(a, b, dy):
    y, vjp = jax.vjp(lambda a, b: gemm_fp4_bf16(a, b, RECIPE, key=KEY), a, b)
    return (y, *vjp(dy))


@functools.cache
def fp4_inputs(m=M, n=N):
    return random_bf16(0, (8, m // 8, K)), random_bf16(1, (n, K)), random_bf16(2, (8, m // 8, n))


@functools.cache
def fp4_unsharded(m=M, n=N):
    return unsharded(fp4_step, *fp4_inputs(m, n))


# Per GEMM, the copies it multiplies as A [rows, contraction] . B [cols, contraction]^T: (tensor, role, columnwise).
FP4_GEMM_COPIES = {"fprop": (("x", "activation", False), ("w", "weight", False)),
                   "dgrad": (("g", "gradient", False), ("w", "weight", True)),
                   "wgrad": (("g", "gradient", True), ("x", "activation", True))}


def fp4_operands(gemm, a, b, dy):
    """The dequantized copies that one GEMM of fp4_step multiplies, made by hand as the recipe says (float64,
    Hadamard-rotated along the contraction): fprop x [M, K] . w [N, K]^T, dgrad g [M, N] . w^T's copy [K, N]^T,
    wgrad g^T's copy [N, M] . x^T's copy [K, M]^T."""
    tensors = {"x": a, "w": b, "g": dy}
    copies = []
    for name, role, columnwise in FP4_GEMM_COPIES[gemm]:
        t = tensors[name]
        with jax.default_device(DEVICES[0]):
            data, scales = cast_mxfp4(t.reshape(-1, t.shape[-1]), columnwise=columnwise,
                                      sr_key=role_sr_key(jnp.asarray(KEY), role),
                                      hadamard=getattr(RECIPE, f"{gemm}_hadamard"), hadamard_key=RECIPE.hadamard_seed)
            copies.append(_oracle.f64(dequantize_mxfp4(data, scales)))
    return copies


def spec_axes(*entries) -> tuple[str, ...]:
    """The mesh axes named by PartitionSpec entries."""
    return tuple(a for entry in entries if entry for a in ((entry,) if isinstance(entry, str) else entry))


def blocks(mesh, *entries) -> int:
    return math.prod(mesh.shape[a] for a in spec_axes(*entries))


@pytest.mark.parametrize("layout", FP4_LAYOUTS)
def test_fp4_training_step_sharded_equals_unsharded(layout):
    shape, names, tokens, weight_spec = FP4_LAYOUTS[layout]
    mesh = make_mesh(shape, names)
    act, weight = NamedSharding(mesh, P(tokens, None, None)), NamedSharding(mesh, weight_spec)
    a, b, dy = fp4_inputs()
    step = jax.jit(fp4_step, in_shardings=(act, weight, act), out_shardings=(act, act, weight))
    compiled = step.lower(a, b, dy).compile()
    y, da, db = compiled(a, b, dy)
    y0, da0, db0 = fp4_unsharded()
    assert y.sharding == da.sharding == act and db.sharding == weight
    # fprop and dgrad multiply the same quantized bytes over the whole contraction on every device.
    assert_summation_order_close(y, y0, *fp4_operands("fprop", a, b, dy))
    assert_summation_order_close(da, da0, *fp4_operands("dgrad", a, b, dy))
    # wgrad rounds one bf16 partial product per token block (AITER's FP4 GEMM writes bf16), sums the J partials
    # in float32 and rounds once; the unsharded wgrad rounds one float32 sum once. Each rounding moves its value
    # by at most u = 2^-8 of it: |db - db0| <= u (2 |exact| + sum_j |partial_j|) plus the float32 sums' error,
    # (2M + J) 2^-24 sum|g x| at most (2 (M + J) with the (1 + u) factors).
    g_cols, x_cols = fp4_operands("wgrad", a, b, dy)
    parts = blocks(mesh, tokens)
    partials = sum(np.abs(g @ x.T) for g, x in zip(np.split(g_cols, parts, axis=1), np.split(x_cols, parts, axis=1)))
    bound = (2.0 ** -8 * (2 * np.abs(g_cols @ x_cols.T) + partials)
             + (M + parts) * 2.0 ** -23 * (np.abs(g_cols) @ np.abs(x_cols).T))
    err = np.abs(_oracle.f64(db) - _oracle.f64(db0))
    assert np.all(err <= bound), float(np.max(err / bound))

    ops = collectives(compiled)
    gathers = [types for op, types in ops if op == "all-gather"]
    # Only FP4 bytes and scales are gathered (fprop: W rowwise, dgrad: W columnwise), never the bf16 weight:
    # 2 x (N*K/2 + N*K/32) bytes, 4.25 bits per weight element per GEMM.
    assert gathers and all(dtype == "u8" for types in gathers for dtype, _ in types)
    assert sum(math.prod(s) for types in gathers for _, s in types) == 2 * (N * K // 2 + N * K // 32)
    # wgrad: float32 blocks of the weight's shard, reduce-scattered over the axes that split both tokens and
    # the weight, all-reduced over the token axes that do not split the weight.
    shard = N * K // blocks(mesh, *weight_spec)
    reduced = {op for op, types in ops for dtype, s in types
               if op in ("reduce-scatter", "all-reduce") and dtype == "f32" and math.prod(s) == shard}
    token_axes, weight_axes = set(spec_axes(tokens)), set(spec_axes(*weight_spec))
    assert ("reduce-scatter" in reduced) == bool(token_axes & weight_axes)
    assert ("all-reduce" in reduced) == bool(token_axes - weight_axes)


@pytest.mark.parametrize("cast", ["native", "xla"])
@pytest.mark.parametrize("layout", ["fsdp", "tokens_on_data_weight_k_on_fsdp"])
def test_fp4_quantized_copies_are_bit_identical(layout, cast):
    """The forward's outputs, including the columnwise copies of x and W kept for the backward pass, are the
    same bytes whether each device quantizes its shard (at its global index_offset) or one device quantizes all,
    with either cast implementation (the CPU's default is XLA's code; the native kernels run when forced)."""
    if cast == "native" and _native.load("cpu").problem:
        pytest.skip(_native.load("cpu").problem)
    with jax_aiter.use_backend(cast_mxfp4=cast, cast_mxfp4_dual=cast):
        _check_quantized_copies_are_bit_identical(layout)


def _check_quantized_copies_are_bit_identical(layout):
    shape, names, tokens, weight_spec = FP4_LAYOUTS[layout]
    mesh = make_mesh(shape, names)
    a, b, _ = fp4_inputs()
    x = a.reshape(M, K)

    def fprop(x, b):
        return _linear._FPROP_TRAIN((RECIPE, True), x, b, jnp.asarray(KEY))

    sharded = jax.jit(fprop, in_shardings=(NamedSharding(mesh, P(tokens, None)), NamedSharding(mesh, weight_spec)))
    got, want = sharded(x, b), unsharded(fprop, x, b)
    assert [t.dtype for t in got[1:]] == [jnp.uint8] * 4
    assert_summation_order_close(got[0], want[0], *fp4_operands("fprop", a, b, None))
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(g, w)


# Tile-scaled weights, rounded stochastically: each device rounds its own whole 32 x 32 tiles at global indices.
TILE_RECIPE = Mxfp4Recipe(weight_tile_scaling=True, weight_stochastic=True, hadamard_seed=0x1234_5678_9ABC)


@pytest.mark.parametrize("layout", ["fsdp", "tokens_on_data_weight_k_on_fsdp"])
def test_fp4_tile_scaled_weight_sharded_is_the_unsharded_tiles(layout):
    """The training forward's copies of W are the oracle's tile quantization of the whole weight, byte for byte
    against one device, whether each device quantizes its shard or not; the inference forward (its own
    partitioning rule, tiles whole in N as well as K) gives the product of the same tiles."""
    shape, names, tokens, weight_spec = FP4_LAYOUTS[layout]
    mesh = make_mesh(shape, names)
    a, b, _ = fp4_inputs()
    x = a.reshape(M, K)
    in_shardings = (NamedSharding(mesh, P(tokens, None)), NamedSharding(mesh, weight_spec))

    def fprop(x, b):
        return _linear._FPROP_TRAIN((TILE_RECIPE, True), x, b, jnp.asarray(KEY))

    got, want = jax.jit(fprop, in_shardings=in_shardings)(x, b), unsharded(fprop, x, b)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(g, w)
    weight_key = tuple(int(v) for v in role_sr_key(jnp.asarray(KEY), "weight"))
    tiles = oracle.quantize_tiles(_oracle.f64(b).astype(np.float32), "even", weight_key)
    with jax.default_device(DEVICES[0]):
        np.testing.assert_array_equal(_oracle.f64(dequantize_mxfp4(got[3], got[4])), tiles.T)

    def forward(a, b):
        return gemm_fp4_bf16(a, b, TILE_RECIPE, key=KEY)

    y = jax.jit(forward, in_shardings=in_shardings)(x, b)
    x_rows = oracle.dequantize(*oracle.quantize(_oracle.f64(x).astype(np.float32), "even"))
    assert_summation_order_close(y, unsharded(forward, x, b), x_rows, tiles)


def test_fp4_inference_gathers_only_fp4_weight_bytes():
    shape, names, tokens, weight_spec = FP4_LAYOUTS["fsdp"]
    mesh = make_mesh(shape, names)
    act, weight = NamedSharding(mesh, P(tokens, None, None)), NamedSharding(mesh, weight_spec)
    a, b, _ = fp4_inputs()

    def forward(a, b):
        return gemm_fp4_bf16(a, b, RECIPE, key=KEY)

    compiled = jax.jit(forward, in_shardings=(act, weight), out_shardings=act).lower(a, b).compile()
    assert_summation_order_close(compiled(a, b), fp4_unsharded()[0], *fp4_operands("fprop", a, b, None))
    ops = collectives(compiled)
    assert {op for op, _ in ops} == {"all-gather"}
    assert sorted(s for _, types in ops for dtype, s in types if dtype == "u8") == [(N, K // 32), (N, K // 2)]


def test_fp4_indivisible_shards_fall_back_to_gathering():
    """24-row weight shards would split 32-element blocks along N, and 32-token blocks are too few for wgrad's
    64-token operands: the weight (bf16) and the tokens are gathered and every device runs the whole layer."""
    if SIZE != 8:
        pytest.skip(f"the shapes are those that 8 devices cannot split whole; {SIZE} here")
    m, n = 256, 192
    shape, names, tokens, weight_spec = FP4_LAYOUTS["fsdp"]
    mesh = make_mesh(shape, names)
    act, weight = NamedSharding(mesh, P(tokens, None, None)), NamedSharding(mesh, weight_spec)
    inputs = fp4_inputs(m, n)
    step = jax.jit(fp4_step, in_shardings=(act, weight, act), out_shardings=(act, act, weight))
    compiled = step.lower(*inputs).compile()
    for got, want in zip(compiled(*inputs), fp4_unsharded(m, n)):
        np.testing.assert_array_equal(got, want)
    ops = collectives(compiled)
    # XLA's CPU backend may convert the bf16 weight to float32 before gathering it.
    assert any(op == "all-gather" and (n, K) in [s for d, s in types if d in ("bf16", "f32")] for op, types in ops)
    assert "reduce-scatter" not in {op for op, _ in ops}


@pytest.mark.parametrize("recipe", [Mxfp4Recipe.default(), RECIPE], ids=["grouped", "per-weight-sr"])
@pytest.mark.parametrize("layout", FP4_LAYOUTS)
def test_fp4_weights_quantized_ahead_sharded(layout, recipe):
    """quantize_weights on sharded weights: each device casts its shards (grouped by width, or one weight at a
    time at global indices), the copies keep the weight's sharding and equal one device's bytes; the training
    step through them gathers only FP4 bytes and gives the bits of the step on the weights themselves."""
    shape, names, tokens, weight_spec = FP4_LAYOUTS[layout]
    mesh = make_mesh(shape, names)
    act, weight = NamedSharding(mesh, P(tokens, None, None)), NamedSharding(mesh, weight_spec)
    a, b, dy = fp4_inputs()
    weights = {"b": b, "c": random_bf16(3, (2 * N, K))}
    quantize = functools.partial(_linear.quantize_weights, recipe=recipe, key=KEY)
    got = jax.jit(quantize, in_shardings=({"b": weight, "c": weight},))(weights)
    want = unsharded(quantize, weights)
    for name in weights:
        for field in ("row_data", "row_scales", "col_data", "col_scales"):
            copy = getattr(got[name], field)
            np.testing.assert_array_equal(copy, getattr(want[name], field))
        for field, spec in (("row_data", weight_spec), ("col_data", P(*reversed(weight_spec)))):
            assert getattr(got[name], field).sharding.is_equivalent_to(NamedSharding(mesh, spec), 2), field

    def step(a, weights, dy, ahead):
        def forward(a, weights):
            if ahead:
                weights = quantize(weights)
            key = None if recipe == Mxfp4Recipe.default() else KEY
            wide = gemm_fp4_bf16(a, weights["c"], recipe, key=key)
            return gemm_fp4_bf16(a, weights["b"], recipe, key=key) + wide[..., :N] + wide[..., N:]
        y, vjp = jax.vjp(forward, a, weights)
        return (y, *vjp(dy))

    in_shardings = (act, {"b": weight, "c": weight}, act)
    compiled = jax.jit(functools.partial(step, ahead=True), in_shardings=in_shardings).lower(a, weights, dy).compile()
    gathers = [types for op, types in collectives(compiled) if op == "all-gather"]
    assert gathers and all(dtype == "u8" for types in gathers for dtype, _ in types)
    if recipe == Mxfp4Recipe.default():  # the same casts, made ahead
        plain = jax.jit(functools.partial(step, ahead=False), in_shardings=in_shardings)(a, weights, dy)
        for g, w in zip(jax.tree.leaves(compiled(a, weights, dy)), jax.tree.leaves(plain)):
            np.testing.assert_array_equal(g, w)


# name: (mesh shape, mesh axes, sharding of a[B, S, K], sharding of the weight [N, K])
GEMM_LAYOUTS = {
    "fsdp": ((SIZE,), ("fsdp",), P("fsdp", None, None), P("fsdp", None)),
    "data_x_fsdp2": ((HALF, 2), ("data", "fsdp"), P(("data", "fsdp"), None, None), P("fsdp", None)),
    "tokens_on_data_weight_on_fsdp": ((2, HALF), ("data", "fsdp"), P("data", None, None), P("fsdp", None)),
    "weight_over_both_axes_tokens_on_fsdp": ((2, HALF), ("data", "fsdp"), P(None, "fsdp", None),
                                             P(("data", "fsdp"), None)),
    "weight_n_and_k_split": ((HALF, 2), ("data", "fsdp"), P("data", "fsdp", None), P("data", "fsdp")),
}


def gemm_step(a, b, dy):
    y, vjp = jax.vjp(gemm, a, b)
    return (y, *vjp(dy))


def gemm_inputs():
    return random_bf16(3, (8, 8, 64)), random_bf16(4, (64, 64)), random_bf16(5, (8, 8, 64))


@pytest.mark.parametrize("layout", GEMM_LAYOUTS)
def test_gemm_sharded_equals_unsharded(layout):
    shape, names, act_spec, weight_spec = GEMM_LAYOUTS[layout]
    mesh = make_mesh(shape, names)
    act, weight = NamedSharding(mesh, act_spec), NamedSharding(mesh, weight_spec)
    a, b, dy = gemm_inputs()
    compiled = jax.jit(gemm_step, in_shardings=(act, weight, act),
                       out_shardings=(act, act, weight)).lower(a, b, dy).compile()
    # wgrad's partial products are reduced in float32 and rounded once, like the unsharded GEMM.
    a2, b2, g2 = (_oracle.f64(t) for t in (a.reshape(64, 64), b, dy.reshape(64, 64)))
    operands = ((a2, b2), (g2, b2.T), (g2.T, a2.T))  # y = a . b^T, da = g . b, db = g^T . a
    for got, want, (left, right) in zip(compiled(a, b, dy), unsharded(gemm_step, a, b, dy), operands):
        assert_summation_order_close(got, want, left, right)
    ops = {op for op, _ in collectives(compiled)}
    assert "all-gather" in ops
    token_axes, weight_axes = set(spec_axes(*act_spec)), set(spec_axes(*weight_spec))
    assert ("reduce-scatter" in ops) == bool(token_axes & weight_axes)
    assert ("all-reduce" in ops) == bool(token_axes - weight_axes)


# --- mesh_axes_of_dims: one test per case its docstring names ----------------------------------------------


def _axes(mesh, spec, shape=(16, 8)):
    return mesh_axes_of_dims(NamedSharding(mesh, spec), shape, mesh)


def logic_mesh(shape, names):
    """A mesh for the logic of mesh_axes_of_dims, which runs nothing: the CPU's 8 virtual devices."""
    cpus = jax.devices("cpu")
    if len(cpus) < math.prod(shape):
        pytest.skip(f"needs {math.prod(shape)} CPU devices (tests/conftest.py forces 8 virtual ones)")
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=cpus[:math.prod(shape)])


def test_mesh_axes_undivided():
    mesh = logic_mesh((4, 2), ("x", "y"))
    assert _axes(mesh, P()) == ((), ())


def test_mesh_axes_one_axis_per_dim():
    mesh = logic_mesh((4, 2), ("x", "y"))
    assert _axes(mesh, P("x", "y")) == (("x",), ("y",))
    assert _axes(mesh, P(None, "x")) == ((), ("x",))


def test_mesh_axes_several_axes_in_either_order():
    mesh = logic_mesh((4, 2), ("x", "y"))
    assert _axes(mesh, P(("x", "y"))) == (("x", "y"), ())
    assert _axes(mesh, P(("y", "x"))) == (("y", "x"), ())


def test_mesh_axes_of_size_one_never_appear():
    mesh = logic_mesh((8, 1), ("x", "one"))
    assert _axes(mesh, P(("x", "one"), None)) == (("x",), ())
    assert _axes(mesh, P(None, "one")) == ((), ())


def test_mesh_axes_part_of_an_axis_reads_as_undivided():
    """Blocks split 2 ways where the op's mesh has one 8-device axis: no list of whole axes names that."""
    mesh = logic_mesh((8,), ("x",))
    coarse = jax.sharding.Mesh(mesh.devices.reshape(2, 4), ("a", "b"))
    assert mesh_axes_of_dims(NamedSharding(coarse, P("a")), (16, 8), mesh) == ((), ())


def test_mesh_axes_other_device_order_reads_as_undivided():
    mesh = logic_mesh((8,), ("x",))
    shuffled = jax.sharding.Mesh(mesh.devices[[1, 0, 2, 3, 4, 5, 6, 7]], ("x",))
    assert mesh_axes_of_dims(NamedSharding(shuffled, P("x")), (16, 8), mesh) == ((), ())
    assert mesh_axes_of_dims(NamedSharding(mesh, P("x")), (16, 8), mesh) == (("x",), ())
