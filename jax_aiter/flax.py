"""Flax NNX layers built on jax_aiter's ops: ``Linear``, ``Mxfp4Linear``, ``Fp8Linear``, ``RMSNorm``, ``SwiGLU`` and
``Attention``.

Install with the optional extra ``pip install "jax-aiter[flax]"``. The layers are thin: each ``__call__`` is the
functional ops (``jax_aiter.gemm.gemm``, ``jax_aiter.gemm_fp4.gemm_fp4_bf16``, ``jax_aiter.gemm_fp8.gemm_fp8``,
``jax_aiter.rmsnorm``, ``jax_aiter.activation.silu_and_mul``, ``jax_aiter.mha.flash_attn_func``) on the layer's
parameters, so a layer computes exactly what those calls compute, under ``jit``, ``grad``, ``nnx.remat`` and
sharding alike.

Conventions:

* Projection weights are stored ``[out_features, in_features]``, the ops' ``b[N, K]`` layout (PyTorch's
  ``nn.Linear.weight``; the transpose of ``flax.nnx.Linear``'s ``kernel``), so no transpose is ever made.
* ``param_dtype`` is the stored (master) dtype, float32 by default; ``dtype`` is the dtype inputs and weights are
  cast to before the GEMM (bfloat16 by default; None keeps them as they are).
* Sharding: ``weight_sharding`` (a tuple of mesh axis names or None per weight dimension, ``[out, in]``) and
  ``scale_sharding`` attach ``nnx.with_partitioning`` metadata; ``nnx.get_partition_spec`` /
  ``nnx.get_named_sharding`` read it as for any NNX model. Flax creates an annotated variable already sharded, so
  build an annotated model inside ``jax.set_mesh(mesh)``. FSDP is ``weight_sharding=("fsdp", None)`` (or
  ``(None, "fsdp")``); the GEMMs are custom-partitioned for it (docs/mxfp4.md, "Sharding").
* MXFP4 stochastic rounding needs a fresh key per step: a layer built with a recipe that rounds stochastically
  draws it from the ``nnx.Rngs`` stream named ``sr_stream`` (default ``"mxfp4"``, which falls back to the
  ``default`` stream), or takes ``key=`` in ``__call__``; an explicit key wins.
* Weights quantized once: inside ``with weights_quantized_once(model):`` every ``Mxfp4Linear`` of the model uses
  FP4 copies of its weight made on entry by ``jax_aiter.gemm_fp4.quantize_weights`` (weights of one width and
  recipe share one cast); the same bits, and once per step when the block spans all microbatches of a step.
* Rematerialization: wrap blocks in ``nnx.remat(..., policy=jax.checkpoint_policies.save_only_these_names(
  *jax_aiter.gemm_fp4.CHECKPOINT_NAMES, *jax_aiter.rmsnorm.CHECKPOINT_NAMES))`` to keep the FP4 copies and the
  norm statistics instead of recomputing them (docs/mxfp4.md, "Rematerialization").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

try:
    from flax import nnx
except ModuleNotFoundError as err:  # pragma: no cover - exercised where flax is absent
    raise ModuleNotFoundError(
        f"jax_aiter.flax needs Flax NNX, which is not installed ({err}); install the extra: "
        "pip install 'jax-aiter[flax]'", name=err.name) from err

from jax_aiter.activation import silu_and_mul
from jax_aiter.gemm import gemm
from jax_aiter.gemm_fp4 import _quantize
from jax_aiter.gemm_fp4._gemm import gemm_fp4
from jax_aiter.gemm_fp4._linear import gemm_fp4_bf16, quantize_weights, role_sr_key
from jax_aiter.gemm_fp4.recipe import Mxfp4Recipe
from jax_aiter.gemm_fp4.tensor import MXFP4Quantizer, WeightWorkspace
from jax_aiter.gemm_fp8 import Fp8Recipe, gemm_fp8
from jax_aiter.rmsnorm import rms_norm, rms_norm_with_add

__all__ = ["Attention", "Fp8Linear", "Linear", "Mxfp4Linear", "RMSNorm", "SwiGLU", "default_weight_init",
           "rotary_embedding", "weights_quantized_once"]

Sharding = Sequence[str | tuple[str, ...] | None] | None
Initializer = Callable[..., jax.Array]

# normal(0, 1/fan_in) on an [out, in] weight: fan_in is the last axis.
default_weight_init: Initializer = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=-1,
                                                                        out_axis=-2)


def _annotated(init: Initializer, sharding: Sharding) -> Initializer:
    return init if sharding is None else nnx.with_partitioning(init, tuple(sharding))


def _cast(x: jax.Array, dtype: Any) -> jax.Array:
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)


def _split_key(key: Any, count: int) -> list[Any]:
    """``count`` independent keys from one (None stays None for every part)."""
    if key is None:
        return [None] * count
    words = _quantize.key_words(key, "key")
    base = jax.random.wrap_key_data(words, impl="threefry2x32")
    return [jax.random.fold_in(base, i) for i in range(count)]


class Linear(nnx.Module):
    """``y = x . W^T`` through ``jax_aiter.gemm.gemm`` (BF16/FP16 GEMM, float32 accumulation); no bias.

    ``weight``: ``[out_features, in_features]`` in ``param_dtype``. Input ``[..., in_features]``, output
    ``[..., out_features]`` in ``dtype`` (which must be bfloat16 or float16, the GEMM's dtypes).
    """

    def __init__(self, in_features: int, out_features: int, *, dtype: Any = jnp.bfloat16,
                 param_dtype: Any = jnp.float32, weight_init: Initializer = default_weight_init,
                 weight_sharding: Sharding = None, rngs: nnx.Rngs):
        self.in_features = in_features
        self.out_features = out_features
        self.dtype = dtype
        self.weight = nnx.Param(_annotated(weight_init, weight_sharding)(rngs.params(), (out_features, in_features),
                                                                         param_dtype))

    def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
        del key  # accepted so that Linear and Mxfp4Linear are interchangeable
        dtype = self.dtype if self.dtype is not None else x.dtype
        return gemm(_cast(x, dtype), _cast(self.weight[...], dtype))


class Mxfp4Linear(Linear):
    """``y = x . W^T`` through ``jax_aiter.gemm_fp4.gemm_fp4_bf16``: MXFP4 fprop, dgrad and wgrad as ``recipe``
    says (default ``Mxfp4Recipe.default()``); bfloat16 output. ``in_features`` and ``out_features`` must be
    multiples of 64.

    Stochastic rounding: when the recipe rounds a role stochastically, each call needs a fresh key: ``key=`` in
    ``__call__``, else one drawn from the ``sr_stream`` stream of the ``rngs`` the layer was built with (the
    stream's counter is layer state, advanced by every call, so ``nnx.jit`` / ``nnx.split`` carry it).

    ``workspace``: a ``WeightWorkspace`` for inference. When the layer's weight is a concrete array (the layer is
    called eagerly, or closed over by a jitted function) and the recipe does not round the weight
    stochastically, the weight's FP4 copy comes from the workspace (keyed by the weight array; a new weight is
    requantized) and only the activation is cast; the result equals the differentiable path's forward. Under
    ``jit``/``grad`` with the weight as an argument the weight is traced and the layer takes the differentiable
    path: nothing is cached there (XLA merges repeated casts of one weight inside a program). Reuse needs the
    stored weight to be the array that is quantized: keep ``param_dtype == dtype`` (or ``dtype=None``).
    """

    def __init__(self, in_features: int, out_features: int, *, recipe: Mxfp4Recipe | None = None,
                 dtype: Any = jnp.bfloat16, param_dtype: Any = jnp.float32,
                 weight_init: Initializer = default_weight_init, weight_sharding: Sharding = None,
                 sr_stream: str = "mxfp4", workspace: WeightWorkspace | None = None, rngs: nnx.Rngs):
        recipe = Mxfp4Recipe.default() if recipe is None else recipe
        if not isinstance(recipe, Mxfp4Recipe):
            raise TypeError(f"recipe must be an Mxfp4Recipe, got {type(recipe).__name__}")
        if in_features % 64 or out_features % 64:
            raise ValueError(f"in_features = {in_features} and out_features = {out_features} must be multiples of 64 "
                             "(gemm_fp4_bf16's K and N)")
        if workspace is not None and not isinstance(workspace, WeightWorkspace):
            raise TypeError(f"workspace must be a WeightWorkspace or None, got {type(workspace).__name__}")
        super().__init__(in_features, out_features, dtype=dtype, param_dtype=param_dtype, weight_init=weight_init,
                         weight_sharding=weight_sharding, rngs=rngs)
        self.recipe = recipe
        self.workspace = workspace
        self.sr_rngs = rngs[sr_stream].fork() if recipe.uses_stochastic_rounding else nnx.data(None)
        # The weight's Mxfp4Weight while weights_quantized_once is in force.
        self.weight_copies = nnx.data(None)

    def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
        if key is None and self.recipe.uses_stochastic_rounding:
            if self.sr_rngs is None:
                raise ValueError("key: the recipe rounds stochastically; pass key= or build the layer with rngs")
            key = self.sr_rngs()
        x = _cast(x, self.dtype)
        if self.weight_copies is not None:
            return gemm_fp4_bf16(x, self.weight_copies, self.recipe, key=key)
        weight = _cast(self.weight[...], self.dtype)
        if self.workspace is not None and not self.recipe.weight_stochastic and _is_concrete(weight):
            return self._forward_from_workspace(x, weight, key)
        return gemm_fp4_bf16(x, weight, self.recipe, key=key)

    def _forward_from_workspace(self, x: jax.Array, weight: jax.Array, key: Any) -> jax.Array:
        """gemm_fp4_bf16's forward with the weight's rowwise copy cached: the same casts (scale rule, fprop
        Hadamard, SR key of the activation role) and the same GEMM."""
        recipe = self.recipe
        size = recipe.hadamard("fprop")
        signs = recipe.hadamard_seed if size else None
        weight_quantizer = MXFP4Quantizer(rowwise_layout="gemm_b", scale_rule=recipe.scale_rule("weight"),
                                          rowwise_hadamard=size, hadamard_seed=signs,
                                          tile_scaling=recipe.weight_tile_scaling)
        w_copy = self.workspace.get_or_quantize(weight, weight_quantizer).rowwise
        rows = x.reshape(-1, x.shape[-1])
        sr_key = None
        if recipe.stochastic("activation"):
            sr_key = role_sr_key(_quantize.key_words(key, "key"), "activation")
        data, scales = _quantize.cast_mxfp4(rows, scale_rule=recipe.scale_rule("activation"), sr_key=sr_key,
                                            hadamard=size, hadamard_key=signs, layout="gemm_a")
        y = gemm_fp4(data, w_copy.data, scales, w_copy.scales)
        return y.reshape(*x.shape[:-1], self.out_features)


@contextlib.contextmanager
def weights_quantized_once(model: nnx.Module) -> Iterator[nnx.Module]:
    """Inside the block, every ``Mxfp4Linear`` of ``model`` multiplies by FP4 copies of its weight (cast to the
    layer's ``dtype``) made on entry by ``jax_aiter.gemm_fp4.quantize_weights``: one call per recipe, so weights of
    one width share a cast where the recipe allows (docs/mxfp4.md, "Weights quantized once"). Outputs and gradients
    are the bits of the layers casting their own weights, except that a recipe rounding weights stochastically
    draws one key per layer from its stream on entry. Use it inside the loss function; around all the microbatches
    of a step, the weights are cast once per step::

        def loss(model, batches):
            with weights_quantized_once(model):
                return sum(loss_of_batch(model, batch) for batch in batches)
    """
    linears = [module for _, module in nnx.iter_modules(model) if isinstance(module, Mxfp4Linear)]
    by_recipe: dict[Mxfp4Recipe, list[Mxfp4Linear]] = {}
    for layer in linears:
        by_recipe.setdefault(layer.recipe, []).append(layer)
    try:
        for recipe, group in by_recipe.items():
            weights = [_cast(layer.weight[...], layer.dtype) for layer in group]
            if recipe.weight_stochastic:
                copies = [quantize_weights(w, recipe, key=layer.sr_rngs()) for w, layer in zip(weights, group)]
            else:
                copies = quantize_weights(weights, recipe)
            for layer, copy in zip(group, copies):
                layer.weight_copies = copy
        yield model
    finally:
        for layer in linears:
            layer.weight_copies = None


def _is_concrete(value: Any) -> bool:
    return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)


class Fp8Linear(Linear):
    """``y = x . W^T`` through ``jax_aiter.gemm_fp8.gemm_fp8``: FP8 fprop, dgrad and wgrad with per-tensor current
    scaling as ``recipe`` says (default ``Fp8Recipe.default()``: E4M3 forward, E5M2 gradients). Input and weight
    are cast to ``dtype`` first (bfloat16 by default; float16 and float32 are accepted too), the output is in it."""

    def __init__(self, in_features: int, out_features: int, *, recipe: Fp8Recipe | None = None,
                 dtype: Any = jnp.bfloat16, param_dtype: Any = jnp.float32,
                 weight_init: Initializer = default_weight_init, weight_sharding: Sharding = None, rngs: nnx.Rngs):
        recipe = Fp8Recipe.default() if recipe is None else recipe
        if not isinstance(recipe, Fp8Recipe):
            raise TypeError(f"recipe must be an Fp8Recipe, got {type(recipe).__name__}")
        super().__init__(in_features, out_features, dtype=dtype, param_dtype=param_dtype, weight_init=weight_init,
                         weight_sharding=weight_sharding, rngs=rngs)
        self.recipe = recipe

    def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
        del key  # accepted so that every projection layer is interchangeable
        dtype = self.dtype if self.dtype is not None else x.dtype
        return gemm_fp8(_cast(x, dtype), _cast(self.weight[...], dtype), self.recipe)


def _projection(in_features: int, out_features: int, *, recipe: Mxfp4Recipe | Fp8Recipe | None, rngs: nnx.Rngs,
                **options: Any) -> Linear:
    """A BF16 ``Linear`` without a recipe, an ``Mxfp4Linear`` with an ``Mxfp4Recipe``, an ``Fp8Linear`` with an
    ``Fp8Recipe``."""
    if recipe is not None and not isinstance(recipe, (Mxfp4Recipe, Fp8Recipe)):
        raise TypeError(f"recipe must be an Mxfp4Recipe, an Fp8Recipe or None, got {type(recipe).__name__}")
    if isinstance(recipe, Mxfp4Recipe):
        return Mxfp4Linear(in_features, out_features, recipe=recipe, rngs=rngs, **options)
    options.pop("sr_stream", None)
    options.pop("workspace", None)
    if recipe is None:
        return Linear(in_features, out_features, rngs=rngs, **options)
    return Fp8Linear(in_features, out_features, recipe=recipe, rngs=rngs, **options)


class RMSNorm(nnx.Module):
    """``rms_norm(x, scale)``; with ``residual``, ``rms_norm_with_add(x, residual, scale)`` returning
    ``(normalized, x + residual)`` (the pre-norm block's residual stream). ``scale`` ``[dim]`` is stored in
    ``param_dtype`` and cast to x's dtype (the native kernels need one dtype)."""

    def __init__(self, dim: int, *, epsilon: float = 1e-6, param_dtype: Any = jnp.float32,
                 scale_init: Initializer = jax.nn.initializers.ones, scale_sharding: Sharding = None,
                 rngs: nnx.Rngs | None = None):
        self.dim = dim
        self.epsilon = epsilon
        key = rngs.params() if rngs is not None else jax.random.key(0)
        self.scale = nnx.Param(_annotated(scale_init, scale_sharding)(key, (dim,), param_dtype))

    def __call__(self, x: jax.Array, residual: jax.Array | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
        gamma = _cast(self.scale[...], x.dtype)
        if residual is None:
            return rms_norm(x, gamma, self.epsilon)
        return rms_norm_with_add(x, residual, gamma, self.epsilon)


class SwiGLU(nnx.Module):
    """The gated MLP ``down(silu(x . W_gate^T) * (x . W_up^T))``: one projection ``gate_up`` to
    ``2 * hidden`` features (weight rows ``[gate | up]``, so one GEMM and one cast of x serve both), then
    ``silu_and_mul`` and the projection ``down``. With a ``recipe`` both projections are ``Mxfp4Linear`` (an
    ``Mxfp4Recipe``) or ``Fp8Linear`` (an ``Fp8Recipe``)."""

    def __init__(self, dim: int, hidden: int, *, recipe: Mxfp4Recipe | Fp8Recipe | None = None,
                 dtype: Any = jnp.bfloat16,
                 param_dtype: Any = jnp.float32, weight_init: Initializer = default_weight_init,
                 weight_sharding: Sharding = None, sr_stream: str = "mxfp4",
                 workspace: WeightWorkspace | None = None, rngs: nnx.Rngs):
        options = dict(recipe=recipe, dtype=dtype, param_dtype=param_dtype, weight_init=weight_init,
                       weight_sharding=weight_sharding, sr_stream=sr_stream, workspace=workspace, rngs=rngs)
        self.gate_up = _projection(dim, 2 * hidden, **options)
        self.down = _projection(hidden, dim, **options)

    def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
        gate_up_key, down_key = _split_key(key, 2)
        return self.down(silu_and_mul(self.gate_up(x, key=gate_up_key)), key=down_key)


def rotary_embedding(x: jax.Array, theta: float = 10000.0) -> jax.Array:
    """Rotary position embedding of ``x [B, S, H, D]`` at positions ``0..S-1``, rotating the two halves of the
    head dimension (the GPT-NeoX / Llama layout), in float32; returned in x's dtype."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    """Multi-head self-attention over ``x [B, S, dim]``: projections ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``, a positional embedding on q and k, and ``jax_aiter.mha.flash_attn_func`` (grouped-query when
    ``kv_heads < heads``; causal by default).

    ``rope``: ``rotary_embedding`` by default, any function ``[B, S, H, D] -> [B, S, H, D]``, or None for none.
    ``softmax_scale`` defaults to ``1/sqrt(head_dim)``. ``jax_aiter.mha`` ships as the separate package
    ``jax-aiter-mha`` and is imported when the layer is first called.
    """

    def __init__(self, dim: int, heads: int, kv_heads: int | None = None, head_dim: int | None = None, *,
                 causal: bool = True, rope: Callable[[jax.Array], jax.Array] | None = rotary_embedding,
                 softmax_scale: float | None = None, recipe: Mxfp4Recipe | Fp8Recipe | None = None,
                 dtype: Any = jnp.bfloat16,
                 param_dtype: Any = jnp.float32, weight_init: Initializer = default_weight_init,
                 weight_sharding: Sharding = None, sr_stream: str = "mxfp4",
                 workspace: WeightWorkspace | None = None, rngs: nnx.Rngs):
        kv_heads = heads if kv_heads is None else kv_heads
        if heads % kv_heads:
            raise ValueError(f"heads = {heads} must be a multiple of kv_heads = {kv_heads}")
        head_dim = dim // heads if head_dim is None else head_dim
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.causal = causal
        self.rope = rope
        self.softmax_scale = softmax_scale
        options = dict(recipe=recipe, dtype=dtype, param_dtype=param_dtype, weight_init=weight_init,
                       weight_sharding=weight_sharding, sr_stream=sr_stream, workspace=workspace, rngs=rngs)
        self.q_proj = _projection(dim, heads * head_dim, **options)
        self.k_proj = _projection(dim, kv_heads * head_dim, **options)
        self.v_proj = _projection(dim, kv_heads * head_dim, **options)
        self.o_proj = _projection(heads * head_dim, dim, **options)

    def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
        from jax_aiter.mha import flash_attn_func

        batch, seq = x.shape[:2]
        keys = _split_key(key, 4)
        q = self.q_proj(x, key=keys[0]).reshape(batch, seq, self.heads, self.head_dim)
        k = self.k_proj(x, key=keys[1]).reshape(batch, seq, self.kv_heads, self.head_dim)
        v = self.v_proj(x, key=keys[2]).reshape(batch, seq, self.kv_heads, self.head_dim)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        out = flash_attn_func(q, k, v, softmax_scale=self.softmax_scale, causal=self.causal)
        return self.o_proj(out.reshape(batch, seq, self.heads * self.head_dim), key=keys[3])
