"""Attention reference: it defines the numerics of ``jax_aiter.mha`` (see docs/attention.md).

Logits are ``softcap·tanh(softmax_scale·q·kᵀ / softcap) + bias + alibi`` in float32 (without the tanh when
``softcap`` is 0), masked by the bottom-right-aligned window; the
softmax, dropout and the product with v are float32 too, and the output is rounded once to q's dtype.
A query row that may see no key gets output 0 and lse −inf, and no gradient flows through it. Masked means
absent: keys and values a query may not see (outside its window, in another sequence, past the last offset)
reach neither its output nor any gradient, even when they hold NaN or Inf.
Gradients come from JAX autodiff of this code, which is written so that masked entries and empty rows
differentiate to exact zeros instead of NaN.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax


# Jitted so that an eager call compiles one program instead of dispatching op by op; inside a caller's jit
# the inner jit is inlined.
@functools.partial(jax.jit, static_argnames=("softmax_scale", "softcap", "window", "dropout_p"))
def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    bias: jax.Array | None,
    alibi_slopes: jax.Array | None,
    dropout_seed: jax.Array | None,
    softmax_scale: float,
    window: tuple[int, int],
    dropout_p: float,
    softcap: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
    """Dense attention. q ``[B, Sq, Hq, D]``, k ``[B, Sk, Hk, D]``, v ``[B, Sk, Hk, Dv]``; bias rank 4,
    broadcastable to ``[B, Hq, Sq, Sk]``; alibi_slopes ``[B, Hq]``; dropout_seed uint32 ``[2]``.

    Returns ``(out [B, Sq, Hq, Dv] in q's dtype, lse [B, Hq, Sq] float32)``.
    """
    sq, sk = q.shape[1], k.shape[1]
    # Bottom-right alignment: query row i sits at key position i + Sk - Sq.
    query_pos = jnp.arange(sq)[:, None] + (sk - sq)
    key_pos = jnp.arange(sk)[None, :]
    allowed = _window_mask(query_pos, key_pos, window)
    additive = None if bias is None else bias.astype(jnp.float32)
    if alibi_slopes is not None:
        distance = jnp.abs(query_pos - key_pos).astype(jnp.float32)
        alibi = -_constant_slopes(alibi_slopes)[:, :, None, None] * distance
        additive = alibi if additive is None else additive + alibi
    return _attend(q, k, v, scale=softmax_scale, softcap=softcap,
                   allowed=None if allowed is None else allowed[None, None],
                   additive=additive, dropout_seed=dropout_seed, dropout_p=dropout_p)


@functools.partial(jax.jit, static_argnames=("softmax_scale", "softcap", "window", "dropout_p"))
def attention_varlen(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    bias: jax.Array | None,
    alibi_slopes: jax.Array | None,
    dropout_seed: jax.Array | None,
    softmax_scale: float,
    window: tuple[int, int],
    dropout_p: float,
    softcap: float = 0.0,
) -> tuple[jax.Array, jax.Array]:
    """Packed attention. q ``[Tq, Hq, D]``, k ``[Tk, Hk, D]``, v ``[Tk, Hk, Dv]``, cumulative offsets
    ``[B+1]``; bias rank 3, broadcastable to ``[Hq, Tq, Tk]`` (packed coordinates); alibi_slopes ``[B, Hq]``.

    The packed sequences are attended as one sequence under a block-diagonal mask, so the result is exact for
    any lengths and needs no maximum length. Tokens past ``cu_seqlens[-1]`` belong to no sequence: output 0,
    lse −inf. Returns ``(out [Tq, Hq, Dv], lse [Hq, Tq] float32)``.
    """
    batch = cu_seqlens_q.shape[0] - 1
    seg_q, pos_q = _segments(cu_seqlens_q, q.shape[0])
    seg_k, pos_k = _segments(cu_seqlens_k, k.shape[0])
    seq_of_q = jnp.clip(seg_q, 0, batch - 1)
    len_q = jnp.diff(cu_seqlens_q)[seq_of_q]
    len_k = jnp.diff(cu_seqlens_k)[seq_of_q]
    # Each query's position in its own sequence's key coordinates (bottom-right alignment per sequence).
    query_pos = (pos_q + len_k - len_q)[:, None]
    key_pos = pos_k[None, :]
    allowed = (seg_q[:, None] == seg_k[None, :]) & (seg_q < batch)[:, None]
    window_allowed = _window_mask(query_pos, key_pos, window)
    if window_allowed is not None:
        allowed = allowed & window_allowed
    additive = None if bias is None else bias.astype(jnp.float32)[None]
    if alibi_slopes is not None:
        distance = jnp.abs(query_pos - key_pos).astype(jnp.float32)
        slopes = _constant_slopes(alibi_slopes)[seq_of_q].T  # [Hq, Tq]
        alibi = (-slopes[:, :, None] * distance)[None]
        additive = alibi if additive is None else additive + alibi
    out, lse = _attend(q[None], k[None], v[None], scale=softmax_scale, softcap=softcap, allowed=allowed[None, None],
                       additive=additive, dropout_seed=dropout_seed, dropout_p=dropout_p)
    return out[0], lse[0]


def _constant_slopes(alibi_slopes: jax.Array) -> jax.Array:
    # ALiBi slopes are fixed hyperparameters, not trained: as in flash-attn, they get no gradient.
    return lax.stop_gradient(alibi_slopes.astype(jnp.float32))


def _segments(cu_seqlens: jax.Array, total: int) -> tuple[jax.Array, jax.Array]:
    """Per token: the sequence it belongs to (``B`` when past the last one) and its position in it."""
    tokens = jnp.arange(total, dtype=cu_seqlens.dtype)
    # side="right" skips empty sequences, whose start equals the next one's.
    seg = jnp.searchsorted(cu_seqlens[1:], tokens, side="right")
    start = cu_seqlens[jnp.clip(seg, 0, cu_seqlens.shape[0] - 2)]
    return seg, tokens - start


def _window_mask(query_pos: jax.Array, key_pos: jax.Array, window: tuple[int, int]) -> jax.Array | None:
    left, right = window
    allowed = None
    if left >= 0:
        allowed = key_pos >= query_pos - left
    if right >= 0:
        upper = key_pos <= query_pos + right
        allowed = upper if allowed is None else allowed & upper
    return allowed


def _grouped(x: jax.Array, kv_heads: int, groups: int) -> jax.Array:
    """``[B', H', Sq', Sk']`` with H' in {1, Hq} -> ``[B', Hk|1, G|1, Sq', Sk']`` to match grouped logits."""
    if x.shape[1] == 1:
        return x[:, :, None]
    return x.reshape(x.shape[0], kv_heads, groups, *x.shape[2:])


# Queries per block of the chunked form: with more queries than this (and no dropout), each block of queries is
# attended on its own and recomputed in the backward pass, so neither pass holds the [Sq, Sk] float32 logits of a
# head at once, only [QUERY_CHUNK, Sk].
QUERY_CHUNK = 512


def _attend(q, k, v, *, scale, softcap, allowed, additive, dropout_seed, dropout_p):
    """Masked softmax attention on ``[B, S, H, D]`` tensors, with MQA/GQA by grouping query heads.

    ``allowed`` and ``additive`` are ``[B|1, Hq|1, Sq|1, Sk]``. The work is done head-major (q
    ``[B, Hk, G, Sq, D]``, k and v ``[B, Hk, Sk, D]``): both products then batch over leading axes and the
    float32 logits are produced in the layout the softmax reads, where the sequence-major layout would
    transpose them (measured 2× slower on the CPU). Long query sequences without dropout are attended
    in blocks of :data:`QUERY_CHUNK` queries (a ``lax.map`` of a rematerialized block): every query row is computed
    by the same formulas, equal to the unblocked form up to float32 summation order. With dropout the whole
    [Sq, Sk] grid is kept, because the dropout mask is drawn over it.
    """
    batch, sq, q_heads, _ = q.shape
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    qh = jnp.transpose(q.reshape(batch, sq, kv_heads, groups, q.shape[-1]), (0, 2, 3, 1, 4))
    kh, vh = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))
    allowed = None if allowed is None else _grouped(allowed, kv_heads, groups)
    additive = None if additive is None else _grouped(additive, kv_heads, groups)
    if dropout_p > 0 or sq <= QUERY_CHUNK:
        out, lse = _attend_block(qh, kh, vh, scale=scale, softcap=softcap, allowed=allowed, additive=additive,
                                 dropout_seed=dropout_seed, dropout_p=dropout_p)
    else:
        out, lse = _attend_chunked(qh, kh, vh, scale=scale, softcap=softcap, allowed=allowed, additive=additive)
    out = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(batch, sq, q_heads, v.shape[-1])
    return out, lse.reshape(batch, q_heads, sq)


def _attend_chunked(qh, kh, vh, *, scale, softcap, allowed, additive):
    """:func:`_attend_block` over blocks of :data:`QUERY_CHUNK` queries, each recomputed in the backward pass."""
    sq = qh.shape[3]
    chunks = -(-sq // QUERY_CHUNK)
    pad = chunks * QUERY_CHUNK - sq

    def blocks(x):
        """x (query axis 3, of length Sq, or 1 for a broadcast) split into [chunks, ...] blocks of queries."""
        if x is None or x.shape[3] == 1:
            return None
        x = jnp.pad(x, [(0, pad if a == 3 else 0) for a in range(x.ndim)])
        x = x.reshape(*x.shape[:3], chunks, QUERY_CHUNK, *x.shape[4:])
        return jnp.moveaxis(x, 3, 0)

    # Padded query rows are cut off at the end; they see no key (so they stay finite) when there is a mask.
    per_block = (blocks(qh), blocks(allowed), blocks(additive))
    whole = (allowed if per_block[1] is None else None, additive if per_block[2] is None else None)

    @jax.checkpoint
    def block(q_block, allowed_block, additive_block):
        return _attend_block(q_block, kh, vh, scale=scale, softcap=softcap,
                             allowed=whole[0] if allowed_block is None else allowed_block,
                             additive=whole[1] if additive_block is None else additive_block,
                             dropout_seed=None, dropout_p=0.0)

    out, lse = lax.map(lambda xs: block(*xs), per_block)
    out = jnp.moveaxis(out, 0, 3).reshape(*out.shape[1:4], chunks * QUERY_CHUNK, out.shape[-1])[:, :, :, :sq]
    lse = jnp.moveaxis(lse, 0, 3).reshape(*lse.shape[1:4], chunks * QUERY_CHUNK)[..., :sq]
    return out, lse


def _attend_block(qh, kh, vh, *, scale, softcap, allowed, additive, dropout_seed, dropout_p):
    """Head-major attention: q ``[B, Hk, G, Sq, D]``, k and v ``[B, Hk, Sk, D]``, ``allowed`` and ``additive``
    grouped ``[B|1, Hk|1, G|1, Sq|1, Sk]``. Returns out ``[B, Hk, G, Sq, Dv]`` in q's dtype, lse
    ``[B, Hk, G, Sq]``."""
    batch, kv_heads, groups, sq, _ = qh.shape
    sk = kh.shape[2]
    q32 = qh.astype(jnp.float32)
    k32 = kh.astype(jnp.float32)
    if allowed is not None:
        # Masked means absent: a key no query may see must not reach any output or gradient, even when it holds
        # NaN or Inf (a masked product 0 * NaN would). Logits come from the finite keys; a key with a non-finite
        # element gives a NaN logit, and only where it is allowed.
        finite_key = jnp.all(jnp.isfinite(k32), axis=-1)  # [B, Hk, Sk]
        k32 = jnp.where(finite_key[..., None], k32, 0.0)
    # HIGHEST keeps float32 products exact on GPUs, where the default would round inputs to TF32/bf16.
    logits = jnp.einsum("bhgqd,bhkd->bhgqk", q32, k32, precision=lax.Precision.HIGHEST)
    logits = logits * scale
    if softcap > 0:
        # Soft-capping (Gemma-style) bounds the scaled logits to (-softcap, softcap) before bias and masks.
        logits = softcap * jnp.tanh(logits / softcap)
    if additive is not None:
        logits = logits + additive
    if allowed is not None:
        logits = jnp.where(finite_key[:, :, None, None, :], logits, jnp.nan)
        logits = jnp.where(allowed, logits, -jnp.inf)
    # The row maximum only stabilizes exp and cancels exactly, so it carries no gradient; an empty row has
    # maximum -inf and is shifted by 0 instead, which keeps exp(-inf) = 0 and its derivative 0.
    row_max = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True, initial=-jnp.inf))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    probs = jnp.exp(logits - row_max)
    row_sum = jnp.sum(probs, axis=-1, keepdims=True)
    nonempty = row_sum > 0
    # Substituting 1 for an empty row's sum (instead of masking the quotient) keeps 1/0 out of the gradient.
    safe_sum = jnp.where(nonempty, row_sum, 1.0)
    lse = jnp.where(nonempty, row_max + jnp.log(safe_sum), -jnp.inf)
    weights = probs / safe_sum
    if dropout_p > 0:
        keep = _keep_mask(dropout_seed, dropout_p, (batch, kv_heads * groups, sq, sk))
        # Dropout acts on the normalized probabilities (lse is that of the undropped softmax), scaled so that
        # the expected output equals the output without dropout.
        weights = jnp.where(_grouped(keep, kv_heads, groups), weights / (1.0 - dropout_p), 0.0)
    out = _weighted_values(weights, vh.astype(jnp.float32), allowed)
    return out.astype(qh.dtype), lse[..., 0]


def _weighted_values(weights, v, allowed):
    """``weights [B, Hk, G, Sq, Sk] @ v [B, Hk, Sk, Dv]`` where a value no query may see cannot reach the output:
    with non-finite values present, each output element is NaN (or ±Inf) exactly when an allowed key's value
    is, and the finite values' weighted sum otherwise. The usual all-finite case costs one product."""

    def product(weights, values):
        return jnp.einsum("bhgqk,bhkd->bhgqd", weights, values, precision=lax.Precision.HIGHEST)

    if allowed is None:
        return product(weights, v)

    def with_non_finite(weights, v):
        finite = jnp.isfinite(v)
        out = product(weights, jnp.where(finite, v, 0.0))
        seen = jnp.broadcast_to(allowed, weights.shape).astype(jnp.float32)
        count = lambda marks: product(seen, marks.astype(jnp.float32))  # noqa: E731
        nan, pos_inf, neg_inf = count(jnp.isnan(v)) > 0, count(v == jnp.inf) > 0, count(v == -jnp.inf) > 0
        out = jnp.where(pos_inf, jnp.inf, jnp.where(neg_inf, -jnp.inf, out))
        return jnp.where(nan | (pos_inf & neg_inf), jnp.nan, out)

    return lax.cond(jnp.all(jnp.isfinite(v)), product, with_non_finite, weights, v)


def _keep_mask(dropout_seed: jax.Array, dropout_p: float, shape: tuple[int, ...]) -> jax.Array:
    """Keep an element unless its Philox4x32 word falls below dropout_p·2³² (key = seed, counter from 0).

    XLA's RngBitGenerator with an explicit algorithm produces the same bits on every platform, compiles to one
    operation (threefry-based jax.random compiles several times slower on CPU), and Philox is the generator
    GPU attention kernels use for dropout.
    """
    state = jnp.concatenate([dropout_seed, jnp.zeros(2, jnp.uint32)])
    _, bits = lax.rng_bit_generator(state, shape, dtype=jnp.uint32, algorithm=lax.RandomAlgorithm.RNG_PHILOX)
    return bits >= jnp.uint32(int(dropout_p * 2**32))
