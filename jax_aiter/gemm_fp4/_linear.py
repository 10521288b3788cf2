"""``gemm_fp4_bf16``: a linear layer ``y = a . b^T`` with MXFP4 GEMMs in the forward and both backward passes.

Each tensor is cast once: x and W by a dual cast in the forward pass (the columnwise copies are the residuals
for the backward pass, smaller than the bf16 tensors), g by a dual cast in the backward pass. Without
differentiation only the rowwise copies of x and W are made. All GEMMs go through the public ``gemm_fp4`` or
``gemm_bf16_fp4`` and all casts through the public cast ops, so native kernels are picked up by backend dispatch.

The A operands of fprop and dgrad (the rowwise copies of x and g) are cast just before their GEMMs. On a platform
where ``gemm_fp4`` emulates (no FP4 matrix units), the cast writes those copies as their exact bf16 values and
``gemm_bf16_fp4`` takes them: the same values and the same dot as ``gemm_fp4``'s emulation, without packing A and
dequantizing it again; with AITER's FP4 kernels the copies stay packed. wgrad's A operand, g's columnwise copy,
stays packed everywhere: the cast writes a columnwise copy one column of x per thread, and as values those
stores scatter (on the H200 they cost the cast more than dequantizing the packed copy costs the GEMM).

The residuals carry ``jax.ad_checkpoint.checkpoint_name``s (:data:`ACTIVATION_COPY_NAME`,
:data:`WEIGHT_COPY_NAME`), so a ``jax.checkpoint`` policy can keep them instead of re-running the forward casts in
the backward pass (docs/mxfp4.md, "Rematerialization").

The forward and the backward pass are each one custom-partitioned op (``jax_aiter._partition``): under FSDP each
device quantizes its own blocks at their global indices, gathers the weight's FP4 copies (never bf16, never
shuffled) and reduces wgrad over the token axes (docs/mxfp4.md, "Sharding").
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from jax_aiter import _checks
from jax_aiter._partition import LinearOp
from jax_aiter.gemm_fp4 import _quantize
from jax_aiter.gemm_fp4._gemm import emulates_gemm_fp4, gemm_bf16_fp4, gemm_fp4, gemm_fp4_plain_b
from jax_aiter.gemm_fp4.recipe import Mxfp4Recipe
from jax_aiter.gemm_fp4.tensor import MXFP4Quantizer, Mxfp4Weight

__all__ = ["ACTIVATION_COPY_NAME", "CHECKPOINT_NAMES", "WEIGHT_COPY_NAME", "gemm_fp4_bf16", "quantize_weights",
           "role_sr_key"]

# Checkpoint names of the residuals, for jax.checkpoint policies (jax.checkpoint_policies.save_only_these_names):
# x's columnwise FP4 copy (wgrad's B operand) and W's columnwise FP4 copy (dgrad's B operand), data and scales.
ACTIVATION_COPY_NAME = "mxfp4_activation"
WEIGHT_COPY_NAME = "mxfp4_weight"
CHECKPOINT_NAMES = (ACTIVATION_COPY_NAME, WEIGHT_COPY_NAME)

# Token rows are zero-padded to this multiple: wgrad contracts over them, and its shuffled B operand (x^T)
# needs a contraction length that is a multiple of 64. Zero rows add nothing to any product.
TOKEN_MULTIPLE = 64
_ROLE_INDEX = {"activation": 0, "weight": 1, "gradient": 2}


def role_sr_key(key_words: jax.Array, role: str) -> jax.Array:
    """The stochastic-rounding words of one role: threefry ``fold_in`` of the call's key with the role's index
    (activation 0, weight 1, gradient 2), then two words of ``jax.random.bits``."""
    key = jax.random.wrap_key_data(key_words, impl="threefry2x32")
    return jax.random.bits(jax.random.fold_in(key, _ROLE_INDEX[role]), (2,), jnp.uint32)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _PrimalDtypes:
    a: np.dtype
    b: np.dtype


def _token_matrix(t: jax.Array) -> tuple[jax.Array, int]:
    rows = math.prod(t.shape[:-1])
    matrix = t.reshape(rows, t.shape[-1])
    padded = -(-rows // TOKEN_MULTIPLE) * TOKEN_MULTIPLE
    return (jnp.pad(matrix, ((0, padded - rows), (0, 0))) if padded != rows else matrix), rows


def _cast(t: jax.Array, role: str, recipe: Mxfp4Recipe, key_words: jax.Array, *, rowwise: str,
          columnwise: str | None, index_offset: jax.Array | None) -> tuple[tuple, tuple | None]:
    """The role's copies of the 2-D ``t`` (a device's block of it, at ``index_offset``) with the layouts asked
    for: ``((data, scales), (data, scales) or None)``, from one dual cast when both are wanted. Scale rule,
    stochastic rounding and the Hadamard size of each copy come from the role's quantizer."""
    quantizer = MXFP4Quantizer.for_role(role, recipe)
    sizes = (quantizer.rowwise_hadamard, quantizer.columnwise_hadamard if columnwise else 0)
    # Weight tiles are whole in every shard (N and K split in multiples of 32), their hashes at global indices.
    t, sr_key = quantizer.apply_tiles(t, role_sr_key(key_words, role) if recipe.stochastic(role) else None,
                                      index_offset)
    common = dict(scale_rule=quantizer.scale_rule, index_offset=index_offset, sr_key=sr_key,
                  hadamard_key=quantizer.hadamard_seed if any(sizes) else None)
    if columnwise is None:
        return _quantize.cast_mxfp4(t, hadamard=sizes[0], layout=rowwise, **common), None
    return _quantize.cast_mxfp4_dual(t, hadamard_rowwise=sizes[0], hadamard_columnwise=sizes[1],
                                     layout_rowwise=rowwise, layout_columnwise=columnwise, **common)


def _by_platform(values_route: dict[str, bool], packed_fn, values_fn, *args):
    """``values_fn(*args)`` on the platforms where ``values_route`` says so, ``packed_fn(*args)`` elsewhere."""
    routes = set(values_route.values())
    if len(routes) == 1:
        return (values_fn if routes.pop() else packed_fn)(*args)
    return jax.lax.platform_dependent(*args, default=values_fn,
                                      **{p: values_fn if v else packed_fn for p, v in values_route.items()})


def _fprop(static, split, x, w, key_words):
    """y = x . w^T for one device's token rows, and (when differentiating) the columnwise copies of x and w as
    residuals, in the plain layout: those stay split like x and w, so their values do not depend on the split.

    A split weight is quantized shard by shard and its FP4 bytes and scales are gathered in the plain layout (the
    AITER implementation shuffles them): blocks run along K (and, for the residual, along N) and never straddle a
    shard."""
    recipe, keep_residuals = static
    gathered = split.splits("n", "k")
    b_layout = "plain" if gathered else "gemm_b"
    w_row, w_col = _cast(w, "weight", recipe, key_words, rowwise=b_layout,
                         columnwise="plain" if keep_residuals else None,
                         index_offset=split.index_offset(("n", w.shape[0]), ("k", w.shape[1])))
    if gathered:
        w_row = tuple(split.gather(t, n=0, k=1) for t in w_row)
    results = _fprop_from_weight_copy(recipe, keep_residuals, split, x, w_row, b_layout, key_words)
    return (*results, *w_col) if keep_residuals else results


def _fprop_quantized_weight(static, split, x, w_row_data, w_row_scales, key_words):
    """:func:`_fprop` with the weight's rowwise copy made ahead (plain, gathered here when split); the residuals
    are x's columnwise copy only, the weight's columnwise copy being the caller's."""
    recipe, keep_residuals = static
    w_row = tuple(split.gather(t, n=0, k=1) for t in (w_row_data, w_row_scales))
    return _fprop_from_weight_copy(recipe, keep_residuals, split, x, w_row, "plain", key_words)


def _fprop_from_weight_copy(recipe, keep_residuals, split, x, w_row, b_layout, key_words):
    """y (and x's columnwise copy when ``keep_residuals``) from the weight's whole rowwise copy in ``b_layout``."""
    residual = "plain" if keep_residuals else None

    def activation_copies(x, key_words, rowwise):
        return _cast(x, "activation", recipe, key_words, rowwise=rowwise, columnwise=residual,
                     index_offset=split.index_offset(rows=("m", x.shape[0])))

    def packed(x, key_words, b, b_scale):
        x_row, x_col = activation_copies(x, key_words, "gemm_a")
        return (gemm_fp4_plain_b if b_layout == "plain" else gemm_fp4)(x_row[0], b, x_row[1], b_scale), x_col

    def values(x, key_words, b, b_scale):
        x_row, x_col = activation_copies(x, key_words, "values")
        return gemm_bf16_fp4(x_row[0], b, b_scale, b_layout=b_layout), x_col

    route = emulates_gemm_fp4(x.shape[0], w_row[0].shape[0], x.shape[1], b_layout)
    y, x_col = _by_platform(route, packed, values, x, key_words, *w_row)
    return (y, *x_col) if keep_residuals else (y,)


def _backward(recipe, split, g, x_col_data, x_col_scales, w_col_data, w_col_scales, key_words):
    """dx = g . w for one device's token rows (w^T's copy gathered over the weight's shards), and dw = g^T . x
    over this device's tokens, reduced over the token axes to the weight's split."""
    # The residual copies are B operands in the plain layout: the emulations dequantize them as they are.
    w_col = tuple(split.gather(t, k=0, n=1) for t in (w_col_data, w_col_scales))

    def gradient_copies(g, key_words, rowwise):
        return _cast(g, "gradient", recipe, key_words, rowwise=rowwise, columnwise="gemm_a",
                     index_offset=split.index_offset(rows=("m", g.shape[0])))

    def packed(g, key_words, w_col_data, w_col_scales, x_col_data, x_col_scales):
        g_row, g_col = gradient_copies(g, key_words, "gemm_a")
        return (gemm_fp4_plain_b(g_row[0], w_col_data, g_row[1], w_col_scales),
                gemm_fp4_plain_b(g_col[0], x_col_data, g_col[1], x_col_scales))

    def values(g, key_words, w_col_data, w_col_scales, x_col_data, x_col_scales):
        g_row, g_col = gradient_copies(g, key_words, "values")
        return (gemm_bf16_fp4(g_row[0], w_col_data, w_col_scales, b_layout="plain"),
                gemm_fp4_plain_b(g_col[0], x_col_data, g_col[1], x_col_scales))

    route = emulates_gemm_fp4(g.shape[0], w_col[0].shape[0], g.shape[1], "plain")
    dx, dw = _by_platform(route, packed, values, g, key_words, *w_col, x_col_data, x_col_scales)
    return dx, split.reduce_over_tokens(dw, n=0, k=1)


# Per shard, quantization blocks must be whole: 32 elements along K (rowwise copies of W), along N (W's
# columnwise copy) and along the tokens (the columnwise copies of x and g); and wgrad's operands need whole
# 64-token contractions (its shuffled B operand, x^T). Without differentiation only K matters.
_FPROP = LinearOp(_fprop, operands=("m _", "n k", "_"), results=("m _",), multiples={"k": 32})
_FPROP_TILES = LinearOp(_fprop, operands=("m _", "n k", "_"), results=("m _",), multiples={"n": 32, "k": 32})
_TRAINING = {"m": TOKEN_MULTIPLE, "n": 32, "k": 32}
_FPROP_TRAIN = LinearOp(_fprop, operands=("m _", "n k", "_"), results=("m _", "_ m/2", "_ m/32", "k n/2", "k n/32"),
                        multiples=_TRAINING)
_BACKWARD = LinearOp(_backward, operands=("m _", "_ m/2", "_ m/32", "k n/2", "k n/32", "_"), results=("m _", "n k"),
                     multiples=_TRAINING)

# The same with the weight's copies made ahead (quantize_weights): its blocks were whole along N and K already.
_FPROP_QUANTIZED = LinearOp(_fprop_quantized_weight, operands=("m _", "n k/2", "n k/32", "_"), results=("m _",),
                            multiples={"n": 32, "k": 32})
_FPROP_QUANTIZED_TRAIN = LinearOp(_fprop_quantized_weight, operands=("m _", "n k/2", "n k/32", "_"),
                                  results=("m _", "_ m/2", "_ m/32"), multiples=_TRAINING)


def _forward(a, b, key_words, recipe, *, keep_residuals):
    x, rows = _token_matrix(a)
    op = _FPROP_TRAIN if keep_residuals else _FPROP_TILES if recipe.weight_tile_scaling else _FPROP
    y, *residuals = op((recipe, keep_residuals), x, b, key_words)
    y = y[:rows].reshape(*a.shape[:-1], b.shape[0])
    return y, (*residuals, key_words, _PrimalDtypes(a.dtype, b.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gemm_fp4_bf16(a, b, key_words, recipe):
    return _forward(a, b, key_words, recipe, keep_residuals=False)[0]


def _fwd(a, b, key_words, recipe):
    y, (x_data, x_scales, w_data, w_scales, *rest) = _forward(a, b, key_words, recipe, keep_residuals=True)
    # Identity in the program; marks the FP4 copies as saveable by name under jax.checkpoint. Both halves of a
    # copy carry the name: a policy that kept only the data would still re-run the cast for the scales.
    named = (checkpoint_name(x_data, ACTIVATION_COPY_NAME), checkpoint_name(x_scales, ACTIVATION_COPY_NAME),
             checkpoint_name(w_data, WEIGHT_COPY_NAME), checkpoint_name(w_scales, WEIGHT_COPY_NAME))
    return y, (*named, *rest)


def _bwd(recipe, residuals, dy):
    *quantized, key_words, dtypes = residuals
    g, rows = _token_matrix(dy)
    dx, dw = _BACKWARD(recipe, g, *quantized, key_words)
    dx = dx[:rows].reshape(*dy.shape[:-1], dx.shape[-1])
    return dx.astype(dtypes.a), dw.astype(dtypes.b), np.zeros(key_words.shape, jax.dtypes.float0)


_gemm_fp4_bf16.defvjp(_fwd, _bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _gemm_fp4_bf16_quantized(a, weight, row_data, row_scales, col_data, col_scales, key_words, recipe):
    del weight, col_data, col_scales  # the gradient slot and dgrad's operand
    x, rows = _token_matrix(a)
    y, = _FPROP_QUANTIZED((recipe, False), x, row_data, row_scales, key_words)
    return y[:rows].reshape(*a.shape[:-1], row_data.shape[0])


def _fwd_quantized(a, weight, row_data, row_scales, col_data, col_scales, key_words, recipe):
    x, rows = _token_matrix(a)
    y, x_data, x_scales = _FPROP_QUANTIZED_TRAIN((recipe, True), x, row_data, row_scales, key_words)
    y = y[:rows].reshape(*a.shape[:-1], row_data.shape[0])
    named = (checkpoint_name(x_data, ACTIVATION_COPY_NAME), checkpoint_name(x_scales, ACTIVATION_COPY_NAME))
    return y, (*named, col_data, col_scales, key_words, _PrimalDtypes(a.dtype, weight.dtype))


def _bwd_quantized(recipe, residuals, dy):
    *quantized, key_words, dtypes = residuals
    g, rows = _token_matrix(dy)
    dx, dw = _BACKWARD(recipe, g, *quantized, key_words)
    dx = dx[:rows].reshape(*dy.shape[:-1], dx.shape[-1])
    # dW goes to the weight slot; the copies are integers and the key words have no cotangent.
    return dx.astype(dtypes.a), dw.astype(dtypes.b), None, None, None, None, None


_gemm_fp4_bf16_quantized.defvjp(_fwd_quantized, _bwd_quantized)


# --- weights quantized once per step ----------------------------------------------------------------------


def _weight_copies(recipe, split, w, key_words):
    """One weight's (row data, row scales, column data, column scales), plain, at its shard's global indices."""
    (row_data, row_scales), (col_data, col_scales) = _cast(
        w, "weight", recipe, key_words, rowwise="plain", columnwise="plain",
        index_offset=split.index_offset(("n", w.shape[0]), ("k", w.shape[1])))
    return row_data, row_scales, col_data, col_scales


_WEIGHT_CAST = LinearOp(_weight_copies, operands=("n k", "_"), results=("n k/2", "n k/32", "k n/2", "k n/32"),
                        multiples={"n": 32, "k": 32})


def _grouped_weight_copies(recipe, split, *weights):
    """The copies of every weight (each device's shards), made by one dual cast per (K, dtype): the weights'
    rows stacked, the copies cut back. Rowwise blocks run along K inside a row and columnwise blocks along N never
    straddle two weights (N a multiple of 32 in every shard), so with a weight quantizer that looks only at the
    block (no stochastic rounding, no rotation, no tiles) each weight gets the bytes of its own cast."""
    del split  # the copies depend on nothing but each shard's values
    copies: list = [None] * len(weights)
    no_key = jnp.zeros(2, jnp.uint32)
    for width, dtype in sorted({(w.shape[1], w.dtype.name) for w in weights}):
        members = [i for i, w in enumerate(weights) if w.shape[1] == width and w.dtype.name == dtype]
        stacked = jnp.concatenate([weights[i] for i in members]) if len(members) > 1 else weights[members[0]]
        (row_data, row_scales), (col_data, col_scales) = _cast(stacked, "weight", recipe, no_key, rowwise="plain",
                                                               columnwise="plain", index_offset=None)
        start = 0
        for i in members:
            n = weights[i].shape[0]
            copies[i] = (row_data[start:start + n], row_scales[start:start + n],
                         col_data[:, start // 2:(start + n) // 2], col_scales[:, start // 32:(start + n) // 32])
            start += n
    return tuple(t for weight_copies in copies for t in weight_copies)


@functools.cache
def _grouped_weight_cast(count: int) -> LinearOp:
    # Each weight's dimensions are named apart (by letters: the sharding rule numbers the parts of packed ones),
    # so every weight keeps its own sharding and its copies follow it.
    def tag(i: int) -> str:
        return tag(i // 26 - 1) + chr(ord("a") + i % 26) if i >= 26 else chr(ord("a") + i)

    names = [(f"n{tag(i)}", f"k{tag(i)}") for i in range(count)]
    return LinearOp(_grouped_weight_copies, operands=tuple(f"{n} {k}" for n, k in names),
                    results=tuple(spec for n, k in names for spec in (f"{n} {k}/2", f"{n} {k}/32", f"{k} {n}/2",
                                                                      f"{k} {n}/32")),
                    multiples={name: 32 for pair in names for name in pair})


def _groupable(recipe: Mxfp4Recipe) -> bool:
    quantizer = MXFP4Quantizer.for_role("weight", recipe)
    return not (quantizer.stochastic or quantizer.tile_scaling or quantizer.rowwise_hadamard
                or quantizer.columnwise_hadamard)


def _check_weight(name: str, w: Any) -> tuple[int, int]:
    _checks.check_dtype(name, w, _quantize.INPUT_DTYPES)
    n, k = _checks.check_rank(name, w, 2)
    if k % 64 or n % 64:
        raise ValueError(f"{name}: N = {n} and K = {k} must be multiples of 64 (each is the contraction axis of a "
                         "backward GEMM whose shuffled B operand needs it)")
    return n, k


def quantize_weights(weights: Any, recipe: Mxfp4Recipe | None = None, *, key: Any = None) -> Any:
    """Each weight ``[N, K]`` of the pytree ``weights`` (or a single array) as an :class:`Mxfp4Weight` holding
    both copies ``gemm_fp4_bf16`` needs, quantized as ``recipe`` (default ``Mxfp4Recipe.default()``) says for the
    weight role. Pass the results to ``gemm_fp4_bf16`` as ``b``: outputs and gradients are those of passing the
    weights themselves, bit for bit, except under weight stochastic rounding (below). Differentiable: the
    gradient of each :class:`Mxfp4Weight`'s ``weight`` reaches the weight given here.

    Call it once per optimizer step, outside the loop over microbatches, and the weights are cast once per step
    instead of once per microbatch. Weights of one width K whose recipe rounds the weight role to nearest without
    rotation or tile scales are cast together, one launch per width (docs/mxfp4.md, "Weights quantized once").
    Sharded weights stay sharded: each device casts its shards, the linears gather the FP4 copies.

    ``key`` (int seed, typed key or uint32[2] words): required when the recipe rounds weights stochastically,
    unused otherwise. Weight ``i`` of the flattened pytree then rounds as ``gemm_fp4_bf16`` rounds it given
    ``key=jax.random.fold_in(key, i)`` (seeds and words taken as threefry key data).
    """
    recipe = Mxfp4Recipe.default() if recipe is None else recipe
    if not isinstance(recipe, Mxfp4Recipe):
        raise TypeError(f"recipe must be an Mxfp4Recipe, got {type(recipe).__name__}")
    paths, tree = jax.tree.flatten_with_path(weights)
    if not paths:
        raise ValueError("weights: the pytree holds no arrays")
    leaves = [w for _, w in paths]
    for path, w in paths:
        _check_weight(f"weights{jax.tree_util.keystr(path)}", w)
    if recipe.stochastic("weight"):
        if key is None:
            raise ValueError("key: the recipe rounds weights stochastically; pass a jax.random key (a fresh one "
                             "per step)")
        if not (hasattr(key, "dtype") and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)):
            key = jax.random.wrap_key_data(_quantize.key_words(key, "key"), impl="threefry2x32")
        copies = [_WEIGHT_CAST(recipe, lax.stop_gradient(w), _quantize.key_words(jax.random.fold_in(key, i), "key"))
                  for i, w in enumerate(leaves)]
    elif _groupable(recipe):
        flat = _grouped_weight_cast(len(leaves))(recipe, *map(lax.stop_gradient, leaves))
        copies = [flat[4 * i:4 * i + 4] for i in range(len(leaves))]
    else:
        no_key = jnp.zeros(2, jnp.uint32)
        copies = [_WEIGHT_CAST(recipe, lax.stop_gradient(w), no_key) for w in leaves]
    return tree.unflatten([Mxfp4Weight(w, *c, recipe) for w, c in zip(leaves, copies)])


def _check_quantized_weight(b: Mxfp4Weight, recipe: Mxfp4Recipe) -> None:
    n, k = _check_weight("b.weight", b.weight)
    expected = {"row_data": (n, k // 2), "row_scales": (n, k // 32), "col_data": (k, n // 2),
                "col_scales": (k, n // 32)}
    for field, shape in expected.items():
        array = getattr(b, field)
        _checks.check_dtype(f"b.{field}", array, (jnp.uint8,))
        if tuple(array.shape) != shape:
            raise ValueError(f"b.{field} must have shape {shape} for a weight of shape {(n, k)}, got "
                             f"{tuple(array.shape)}")
    if MXFP4Quantizer.for_role("weight", b.recipe) != MXFP4Quantizer.for_role("weight", recipe):
        raise ValueError("b was quantized with a recipe whose weight role differs from recipe's (scale rule, "
                         "stochastic rounding, fprop/dgrad Hadamard, tile scaling): quantize it with this recipe")


def gemm_fp4_bf16(a: jax.Array, b: jax.Array | Mxfp4Weight, recipe: Mxfp4Recipe | None = None, *,
                  key: Any = None) -> jax.Array:
    """bf16 ``a[..., K] . b[N, K]^T`` with MXFP4 fprop, dgrad and wgrad as ``recipe`` says (default
    ``Mxfp4Recipe.default()``, or ``b``'s recipe when ``b`` is an :class:`Mxfp4Weight`).

    ``a`` and ``b`` are bf16, fp16 or fp32; K and N must be multiples of 64, the token count is free (rows are
    zero-padded internally). Gradients come back in the input dtypes, computed from bf16 GEMM outputs.
    ``b`` may be an :class:`Mxfp4Weight` from :func:`quantize_weights` (its copies are used, its ``weight`` gets
    the gradient); ``recipe`` must then quantize the weight role as ``b`` was.
    ``key`` (int seed, typed ``jax.random`` key or uint32[2]) is required when the recipe uses stochastic
    rounding and unused otherwise; pass a fresh key every step, or every step rounds alike.
    """
    quantized = isinstance(b, Mxfp4Weight)
    recipe = (b.recipe if quantized else Mxfp4Recipe.default()) if recipe is None else recipe
    if not isinstance(recipe, Mxfp4Recipe):
        raise TypeError(f"recipe must be an Mxfp4Recipe, got {type(recipe).__name__}")
    _checks.check_dtype("a", a, _quantize.INPUT_DTYPES)
    a_shape = _checks.check_min_rank("a", a, 1)
    if quantized:
        _check_quantized_weight(b, recipe)
        n, k = b.shape
    else:
        n, k = _check_weight("b", b)
    if k != a_shape[-1]:
        raise ValueError(f"b must be [N, K] with K = a's last dimension {a_shape[-1]}, got shape {(n, k)}")
    # Weights quantized ahead took their rounding key there.
    stochastic = recipe.stochastic("activation") or recipe.stochastic("gradient") or (
        not quantized and recipe.stochastic("weight"))
    if stochastic:
        if key is None:
            raise ValueError("key: the recipe uses stochastic rounding; pass a jax.random key (a fresh one per step)")
        key_words = _quantize.key_words(key, "key")
    else:
        key_words = jnp.zeros(2, jnp.uint32)
    if quantized:
        return _gemm_fp4_bf16_quantized(a, b.weight, b.row_data, b.row_scales, b.col_data, b.col_scales, key_words,
                                        recipe)
    return _gemm_fp4_bf16(a, b, key_words, recipe)
