"""A Llama-style decoder built from jax_aiter's layers (tiny by default; ``models.MODELS`` has larger shapes), and
a synthetic task the tiny one learns in seconds (the demo; ``convergence`` trains it on real text).

Model: token embedding -> N x [RMSNorm -> GQA causal attention -> residual add + RMSNorm -> SwiGLU MLP] ->
RMSNorm -> LM head. Two definitions of the same model, which compute the same function from the same weights
(tests/test_flax.py checks it bit for bit):

* ``TinyLlama``, a Flax NNX module built from ``jax_aiter.flax`` (``RMSNorm``, ``Attention``, ``SwiGLU``,
  ``Linear`` / ``Mxfp4Linear`` / ``Fp8Linear``); defined when Flax is installed (the extra ``jax-aiter[flax]``),
  and what :func:`train` uses then;
* :func:`forward`, the same model as plain functions on a parameter dict, with every projection through
  ``jax_aiter.precision.project`` in the precision the policy gives it: the demo and the convergence benchmark
  run on it without Flax.

Both take a ``jax_aiter.precision.PrecisionPolicy`` (default: every projection BF16) and start from
:func:`init_params`, so a run trains the same weights whichever definition it uses; :func:`train` also takes a
``PrecisionSchedule`` (a closing phase in another policy).

Task ("arithmetic sequences"): each sequence is ``t_i = (start + i * stride) mod vocab`` with a random start and
stride per sequence. The first token carries no information about the stride, later tokens are predictable
from the previous two — the model has to attend back to learn it, so a falling loss shows attention works.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jax_aiter.activation import silu_and_mul
from jax_aiter.gemm_fp4 import Mxfp4Recipe, quantize_weights
from jax_aiter.gemm_fp8 import Fp8Recipe
from jax_aiter.precision import PrecisionPolicy, PrecisionSchedule, Recipe, project
from jax_aiter.rmsnorm import rms_norm_with_add

try:
    from flax import nnx

    from jax_aiter import flax as layers
except ModuleNotFoundError as err:  # without Flax the functional definition still runs
    if not (err.name or "").startswith("flax"):
        raise
    nnx = None

HAS_FLAX = nnx is not None


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    seq_len: int = 32
    dim: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    mlp_dim: int = 256
    batch: int = 32
    steps: int = 150
    learning_rate: float = 3e-3
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def init_params(cfg: Config, key: jax.Array) -> dict:
    def dense(k, n_out, n_in):
        return jax.random.normal(k, (n_out, n_in), jnp.float32) / jnp.sqrt(n_in)

    keys = iter(jax.random.split(key, 2 + 5 * cfg.layers))
    kv_dim = cfg.kv_heads * cfg.head_dim
    blocks = []
    for _ in range(cfg.layers):
        wq = dense(next(keys), cfg.dim, cfg.dim)
        wk, wv = jnp.split(dense(next(keys), 2 * kv_dim, cfg.dim), 2)  # one draw for both, as k|v stacked
        blocks.append({
            "attn_norm": jnp.ones(cfg.dim), "mlp_norm": jnp.ones(cfg.dim), "wq": wq, "wk": wk, "wv": wv,
            "wo": dense(next(keys), cfg.dim, cfg.dim),
            "w_gate_up": dense(next(keys), 2 * cfg.mlp_dim, cfg.dim), "w_down": dense(next(keys), cfg.dim, cfg.mlp_dim),
        })
    return {"embed": 0.5 * jax.random.normal(next(keys), (cfg.vocab, cfg.dim)), "layers": blocks,
            "final_norm": jnp.ones(cfg.dim), "head": dense(next(keys), cfg.vocab, cfg.dim)}


def _rope(x: jax.Array) -> jax.Array:
    """Rotary position embedding on [B, S, H, D]."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def forward(params: dict, tokens: jax.Array, cfg: Config, policy: PrecisionPolicy | None = None, *,
            key: Any = None) -> jax.Array:
    """Logits [B, S, vocab] (float32) of ``tokens`` [B, S], each projection in the precision ``policy`` gives it
    (default BF16). ``key`` (a ``jax.random`` key) is needed when the policy rounds stochastically: projection
    ``i`` (in call order) rounds with ``fold_in(key, i)``."""
    from jax_aiter.mha import flash_attn_func

    policy = PrecisionPolicy.bf16() if policy is None else policy
    dtype = jnp.bfloat16
    batch, seq = tokens.shape
    cast = functools.partial(jnp.asarray, dtype=dtype)
    call_count = 2 + 6 * cfg.layers
    calls = iter(range(call_count))
    projections = _projections(params, cfg, policy)
    quantized = _quantized_once(projections, cast, key, call_count) if policy.quantize_weights_once else {}

    def linear(x: jax.Array, name: str) -> jax.Array:
        index = next(calls)
        w, recipe = projections[name]
        w = quantized[name] if name in quantized else cast(w)
        return project(x, w, recipe, key=None if key is None else jax.random.fold_in(key, index))

    if "embed" in projections:  # the lookup as the GEMM one_hot(tokens) . table: the table and its gradient quantized
        h = linear(jax.nn.one_hot(tokens, cfg.vocab, dtype=dtype), "embed")
    else:
        h = cast(params["embed"][tokens])
    residual = jnp.zeros_like(h)
    for i, layer in enumerate(params["layers"]):
        x, residual = rms_norm_with_add(h, residual, cast(layer["attn_norm"]))
        q = linear(x, f"layers/{i}/wq").reshape(batch, seq, cfg.heads, cfg.head_dim)
        k = linear(x, f"layers/{i}/wk").reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        v = linear(x, f"layers/{i}/wv").reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        attn = flash_attn_func(_rope(q), _rope(k), v, causal=True)
        h = linear(attn.reshape(batch, seq, cfg.dim), f"layers/{i}/wo")
        x, residual = rms_norm_with_add(h, residual, cast(layer["mlp_norm"]))
        h = linear(silu_and_mul(linear(x, f"layers/{i}/w_gate_up")), f"layers/{i}/w_down")
    x, _ = rms_norm_with_add(h, residual, cast(params["final_norm"]))
    return linear(x, "head").astype(jnp.float32)


def _projections(params: dict, cfg: Config, policy: PrecisionPolicy) -> dict[str, tuple[jax.Array, Recipe]]:
    """Each projection's weight (``[K, N]``, as the GEMM takes it) and the recipe ``policy`` gives it, by name; the
    embedding is a projection only when the policy quantizes it."""
    table: dict[str, tuple[jax.Array, Recipe]] = {}
    embedding = policy.recipe_for("embedding")
    if embedding is not None:
        table["embed"] = (params["embed"].T, embedding)
    for i, layer in enumerate(params["layers"]):
        for role, names in (("attention", ("wq", "wk", "wv", "wo")), ("mlp", ("w_gate_up", "w_down"))):
            recipe = policy.recipe_for(role, i, cfg.layers)
            for name in names:
                table[f"layers/{i}/{name}"] = (layer[name], recipe)
    table["head"] = (params["head"], policy.recipe_for("lm_head"))
    return table


def _quantized_once(projections: dict[str, tuple[jax.Array, Recipe]], cast: Callable, key: Any,
                    first_key_index: int) -> dict:
    """The MXFP4 projections' weights (cast as ``forward`` passes them, bf16) made ``Mxfp4Weight``s up front, by
    projection name: one ``quantize_weights`` call per recipe, which casts weights of one width together. A recipe
    that rounds weights stochastically gets ``fold_in(key, first_key_index + its number)``."""
    by_recipe: dict[Mxfp4Recipe, dict[str, jax.Array]] = {}
    for name, (w, recipe) in projections.items():
        if isinstance(recipe, Mxfp4Recipe):
            by_recipe.setdefault(recipe, {})[name] = cast(w)
    quantized = {}
    for number, (recipe, weights) in enumerate(by_recipe.items()):
        recipe_key = None
        if recipe.stochastic("weight") and key is not None:
            recipe_key = jax.random.fold_in(key, first_key_index + number)
        quantized.update(quantize_weights(weights, recipe, key=recipe_key))
    return quantized


def make_batch(cfg: Config, key: jax.Array) -> jax.Array:
    k_start, k_stride = jax.random.split(key)
    start = jax.random.randint(k_start, (cfg.batch, 1), 0, cfg.vocab)
    stride = jax.random.randint(k_stride, (cfg.batch, 1), 1, 8)
    return (start + stride * jnp.arange(cfg.seq_len)[None, :]) % cfg.vocab


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-position cross-entropy (nats) of ``logits`` [..., vocab] against integer ``labels`` [...]."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Mean cross-entropy of ``logits`` (for ``tokens[:, :-1]``) against ``tokens[:, 1:]``, on the arithmetic
    task."""
    # Position 0 predicts token 1 without knowing the stride: excluded, it is noise no model can learn.
    return jnp.mean(cross_entropy(logits, tokens[:, 1:])[:, 1:])


def loss_fn(params: dict, tokens: jax.Array, cfg: Config, policy: PrecisionPolicy | None = None, *,
            key: Any = None) -> jax.Array:
    return next_token_loss(forward(params, tokens[:, :-1], cfg, policy, key=key), tokens)


def adam_init(params: Any) -> dict:
    # Two separate trees of zeros, so that a step may donate the state's buffers.
    return {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
            "t": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, state, lr, b1=0.9, b2=0.95, eps=1e-8):
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    m_hat_scale = 1.0 / (1 - b1 ** t)
    v_hat_scale = 1.0 / (1 - b2 ** t)
    params = jax.tree.map(lambda p, m, v: p - lr * m * m_hat_scale / (jnp.sqrt(v * v_hat_scale) + eps), params, m, v)
    return params, {"m": m, "v": v, "t": t}


def make_train_step(cfg: Config, policy: PrecisionPolicy | None = None):
    @jax.jit
    def step(params, opt_state, key):
        tokens = make_batch(cfg, key)
        # The batch comes from key itself, stochastic rounding from a key derived from it.
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, cfg, policy, key=jax.random.fold_in(key, 1))
        params, opt_state = adam_update(params, grads, opt_state, cfg.learning_rate)
        return params, opt_state, loss

    return step


if HAS_FLAX:

    class Block(nnx.Module):
        """Pre-norm decoder block; the residual stream is added by the next norm (``rms_norm_with_add``)."""

        def __init__(self, cfg: Config, *, attention: Recipe, mlp: Recipe, weight_sharding, rngs: nnx.Rngs):
            options = dict(weight_sharding=weight_sharding, rngs=rngs)
            self.attn_norm = layers.RMSNorm(cfg.dim, rngs=rngs)
            self.attention = layers.Attention(cfg.dim, cfg.heads, cfg.kv_heads, causal=True, rope=_rope,
                                              recipe=attention, **options)
            self.mlp_norm = layers.RMSNorm(cfg.dim, rngs=rngs)
            self.mlp = layers.SwiGLU(cfg.dim, cfg.mlp_dim, recipe=mlp, **options)

        def __call__(self, h: jax.Array, residual: jax.Array) -> tuple[jax.Array, jax.Array]:
            x, residual = self.attn_norm(h, residual)
            x, residual = self.mlp_norm(self.attention(x), residual)
            return self.mlp(x), residual

    def _flax_projection(in_features: int, out_features: int, recipe: Recipe, **options) -> layers.Linear:
        if recipe is None:
            return layers.Linear(in_features, out_features, **options)
        if isinstance(recipe, Fp8Recipe):
            return layers.Fp8Linear(in_features, out_features, recipe=recipe, **options)
        return layers.Mxfp4Linear(in_features, out_features, recipe=recipe, **options)

    class TinyLlama(nnx.Module):
        """The demo model from ``jax_aiter.flax`` layers, each projection in the precision ``policy`` gives it
        (default: every projection BF16). ``weight_sharding`` annotates every projection weight ``[out, in]``
        (e.g. ``("fsdp", None)``).

        The embedding is the parameter ``embed`` [vocab, dim] looked up by token, or with an embedding recipe the
        projection ``embed`` (weight [dim, vocab], the table's transpose) applied to one-hot tokens."""

        def __init__(self, cfg: Config, *, policy: PrecisionPolicy | None = None, weight_sharding=None,
                     rngs: nnx.Rngs):
            policy = PrecisionPolicy.bf16() if policy is None else policy
            if not isinstance(policy, PrecisionPolicy):
                raise TypeError(f"policy must be a PrecisionPolicy or None, got {type(policy).__name__}")
            self.cfg = cfg
            self.quantize_weights_once = policy.quantize_weights_once
            options = dict(weight_sharding=weight_sharding, rngs=rngs)
            embedding = policy.recipe_for("embedding")
            if embedding is None:
                self.embed = nnx.Param(0.5 * jax.random.normal(rngs.params(), (cfg.vocab, cfg.dim)))
            else:
                self.embed = _flax_projection(cfg.vocab, cfg.dim, embedding, **options)
            self.blocks = nnx.List([Block(cfg, attention=policy.recipe_for("attention", i, cfg.layers),
                                          mlp=policy.recipe_for("mlp", i, cfg.layers), **options)
                                    for i in range(cfg.layers)])
            self.final_norm = layers.RMSNorm(cfg.dim, rngs=rngs)
            self.head = _flax_projection(cfg.dim, cfg.vocab, policy.recipe_for("lm_head"), **options)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            if self.quantize_weights_once:
                with layers.weights_quantized_once(self):
                    return self._logits(tokens)
            return self._logits(tokens)

        def _logits(self, tokens: jax.Array) -> jax.Array:
            if isinstance(self.embed, nnx.Param):
                h = self.embed[...][tokens].astype(jnp.bfloat16)
            else:
                h = self.embed(jax.nn.one_hot(tokens, self.cfg.vocab, dtype=jnp.bfloat16))
            residual = jnp.zeros_like(h)
            for block in self.blocks:
                h, residual = block(h, residual)
            x, _ = self.final_norm(h, residual)
            return self.head(x).astype(jnp.float32)

        def load(self, params: dict) -> TinyLlama:
            """Set every weight from an :func:`init_params` dict (same values in both definitions)."""
            if isinstance(self.embed, nnx.Param):
                self.embed[...] = params["embed"]
            else:
                self.embed.weight[...] = params["embed"].T
            self.final_norm.scale[...] = params["final_norm"]
            self.head.weight[...] = params["head"]
            for block, p in zip(self.blocks, params["layers"], strict=True):
                block.attn_norm.scale[...] = p["attn_norm"]
                block.mlp_norm.scale[...] = p["mlp_norm"]
                for proj, name in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv"), ("o_proj", "wo")):
                    getattr(block.attention, proj).weight[...] = p[name]
                block.mlp.gate_up.weight[...] = p["w_gate_up"]
                block.mlp.down.weight[...] = p["w_down"]
            return self

    def make_flax_train_step(cfg: Config, graphdef):
        """One jitted step on the split model (``nnx.split(model, nnx.Param, ...)``): the parameters are
        differentiated, the rest (e.g. the MXFP4 stochastic-rounding stream's counter) is carried along."""

        @jax.jit
        def step(params, rest, opt_state, key):
            tokens = make_batch(cfg, key)

            def loss(params):
                model = nnx.merge(graphdef, params, rest)
                value = next_token_loss(model(tokens[:, :-1]), tokens)
                return value, nnx.state(model, nnx.Not(nnx.Param))

            (value, rest_out), grads = jax.value_and_grad(loss, has_aux=True)(params)
            params, opt_state = adam_update(params, grads, opt_state, cfg.learning_rate)
            return params, rest_out, opt_state, value

        return step


def train(cfg: Config, policy: PrecisionPolicy | PrecisionSchedule | None = None,
          on_step: Callable[[int, float], None] | None = None, *, use_flax: bool | None = None) -> list[float]:
    """Train on the arithmetic task from ``cfg.seed`` and return the loss of every step (same weights and data
    order for every policy).

    ``policy``: the precision of each projection (default: every projection BF16), or a ``PrecisionSchedule``,
    whose closing policy trains the last steps (one compiled step per policy; the weights and the optimizer
    state carry over). ``use_flax``: the ``TinyLlama`` module (default when Flax is installed) or the functional
    :func:`forward` (``False``, or Flax absent); both train alike.
    """
    use_flax = HAS_FLAX if use_flax is None else use_flax
    if use_flax and not HAS_FLAX:
        raise ModuleNotFoundError("use_flax=True needs Flax: pip install 'jax-aiter[flax]'", name="flax")
    if policy is None or isinstance(policy, PrecisionPolicy):
        schedule = PrecisionSchedule(PrecisionPolicy.bf16() if policy is None else policy)
    elif isinstance(policy, PrecisionSchedule):
        schedule = policy
    else:
        raise TypeError(f"policy must be a PrecisionPolicy, a PrecisionSchedule or None, got {type(policy).__name__}")
    final_from = schedule.final_from(cfg.steps)
    key = jax.random.key(cfg.seed)
    params = init_params(cfg, key)
    if use_flax:
        # One model per policy from the same weights. The parameters' tree is the same whatever layer class each
        # projection gets, so the trained parameters and the optimizer state pass on to the closing phase's
        # model; the rest (stochastic-rounding stream counters) is each model's own.
        splits = [nnx.split(TinyLlama(cfg, policy=p, rngs=nnx.Rngs(cfg.seed)).load(params), nnx.Param, ...)
                  for p in schedule.policies]

        def flax_step(graphdef):
            flax_train_step = make_flax_train_step(cfg, graphdef)

            def step(carry, opt_state, key):
                state, rest, opt_state, loss = flax_train_step(*carry, opt_state, key)
                return (state, rest), opt_state, loss

            return step

        steps = [flax_step(graphdef) for graphdef, _, _ in splits]
        carry = splits[0][1:]
    else:
        steps = [make_train_step(cfg, p) for p in schedule.policies]
        carry = params
    opt_state = adam_init(carry[0] if use_flax else carry)
    losses = []
    for i in range(cfg.steps):
        if use_flax and i == final_from:
            carry = (carry[0], splits[1][2])
        carry, opt_state, loss = steps[int(i >= final_from)](carry, opt_state, jax.random.fold_in(key, i))
        losses.append(float(loss))
        if on_step is not None:
            on_step(i, losses[-1])
    return losses
    steps = [make_train_step(cfg, phase_policy) for phase_policy in schedule.policies]
    opt_state = adam_init(params)
    losses = []
    for i in range(cfg.steps):
        params, opt_state, loss = steps[int(i >= final_from)](params, opt_state, jax.random.fold_in(key, i))
        losses.append(float(loss))
        if on_step is not None:
            on_step(i, losses[-1])
    return losses
