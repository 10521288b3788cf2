"""A tiny Llama-style decoder built only from jax_aiter ops, and a synthetic task it can learn in seconds.

Model: token embedding -> N x [RMSNorm -> GQA causal attention -> residual add + RMSNorm -> SwiGLU MLP] ->
RMSNorm -> LM head. Every projection goes through one ``linear(x, w)`` function (``jax_aiter.gemm.gemm`` by
default; the MXFP4 convergence harness passes ``gemm_fp4_bf16`` with a recipe), the norms are
``rms_norm`` / ``rms_norm_with_add``, the MLP gate is ``silu_and_mul`` and attention is ``flash_attn_func``.

Task ("arithmetic sequences"): each sequence is ``t_i = (start + i * stride) mod vocab`` with a random start and
stride per sequence. The first token carries no information about the stride, later tokens are predictable
from the previous two — the model has to attend back to learn it, so a falling loss shows attention works.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jax_aiter.activation import silu_and_mul
from jax_aiter.gemm import gemm
from jax_aiter.rmsnorm import rms_norm, rms_norm_with_add

Linear = Callable[[jax.Array, jax.Array], jax.Array]


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
    layers = []
    for _ in range(cfg.layers):
        layers.append({
            "attn_norm": jnp.ones(cfg.dim), "mlp_norm": jnp.ones(cfg.dim),
            "wq": dense(next(keys), cfg.dim, cfg.dim), "wkv": dense(next(keys), 2 * kv_dim, cfg.dim),
            "wo": dense(next(keys), cfg.dim, cfg.dim),
            "w_gate_up": dense(next(keys), 2 * cfg.mlp_dim, cfg.dim), "w_down": dense(next(keys), cfg.dim, cfg.mlp_dim),
        })
    return {"embed": 0.5 * jax.random.normal(next(keys), (cfg.vocab, cfg.dim)), "layers": layers,
            "final_norm": jnp.ones(cfg.dim), "head": dense(next(keys), cfg.vocab, cfg.dim)}


def _rope(x: jax.Array) -> jax.Array:
    """Rotary position embedding on [B, S, H, D]."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def forward(params: dict, tokens: jax.Array, cfg: Config, linear: Linear = gemm) -> jax.Array:
    from jax_aiter.mha import flash_attn_func

    dtype = jnp.bfloat16
    batch, seq = tokens.shape
    cast = functools.partial(jnp.asarray, dtype=dtype)
    h = cast(params["embed"][tokens])
    residual = jnp.zeros_like(h)
    kv_dim = cfg.kv_heads * cfg.head_dim
    for layer in params["layers"]:
        x, residual = rms_norm_with_add(h, residual, cast(layer["attn_norm"]))
        q = linear(x, cast(layer["wq"])).reshape(batch, seq, cfg.heads, cfg.head_dim)
        kv = linear(x, cast(layer["wkv"]))
        k = kv[..., :kv_dim].reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        v = kv[..., kv_dim:].reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        attn = flash_attn_func(_rope(q), _rope(k), v, causal=True)
        h = linear(attn.reshape(batch, seq, cfg.dim), cast(layer["wo"]))
        x, residual = rms_norm_with_add(h, residual, cast(layer["mlp_norm"]))
        h = linear(silu_and_mul(linear(x, cast(layer["w_gate_up"]))), cast(layer["w_down"]))
    x, _ = rms_norm_with_add(h, residual, cast(params["final_norm"]))
    return linear(x, cast(params["head"])).astype(jnp.float32)


def make_batch(cfg: Config, key: jax.Array) -> jax.Array:
    k_start, k_stride = jax.random.split(key)
    start = jax.random.randint(k_start, (cfg.batch, 1), 0, cfg.vocab)
    stride = jax.random.randint(k_stride, (cfg.batch, 1), 1, 8)
    return (start + stride * jnp.arange(cfg.seq_len)[None, :]) % cfg.vocab


def loss_fn(params: dict, tokens: jax.Array, cfg: Config, linear: Linear = gemm) -> jax.Array:
    logits = forward(params, tokens[:, :-1], cfg, linear)
    labels = tokens[:, 1:]
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    # Position 0 predicts token 1 without knowing the stride: excluded, it is noise no model can learn.
    return jnp.mean(nll[:, 1:])


def adam_init(params: dict) -> dict:
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, state, lr, b1=0.9, b2=0.95, eps=1e-8):
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    m_hat_scale = 1.0 / (1 - b1 ** t)
    v_hat_scale = 1.0 / (1 - b2 ** t)
    params = jax.tree.map(lambda p, m, v: p - lr * m * m_hat_scale / (jnp.sqrt(v * v_hat_scale) + eps), params, m, v)
    return params, {"m": m, "v": v, "t": t}


def make_train_step(cfg: Config, linear: Linear = gemm):
    @jax.jit
    def step(params, opt_state, key):
        tokens = make_batch(cfg, key)
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, cfg, linear)
        params, opt_state = adam_update(params, grads, opt_state, cfg.learning_rate)
        return params, opt_state, loss

    return step


def train(cfg: Config, linear: Linear = gemm, on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train from ``cfg.seed`` and return the loss of every step (same data order for every ``linear``)."""
    key = jax.random.key(cfg.seed)
    params = init_params(cfg, key)
    opt_state = adam_init(params)
    step = make_train_step(cfg, linear)
    losses = []
    for i in range(cfg.steps):
        params, opt_state, loss = step(params, opt_state, jax.random.fold_in(key, i))
        losses.append(float(loss))
        if on_step is not None:
            on_step(i, losses[-1])
    return losses
