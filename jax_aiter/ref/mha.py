"""Attention reference: it defines the numerics of ``jax_aiter.mha`` (see docs/attention.md).

Logits are ``softcap·tanh(softmax_scale·q·kᵀ / softcap) + bias + alibi`` in float32 (without the tanh when
``softcap`` is 0), masked by the bottom-right-aligned window; the
softmax, dropout and the product with v are float32 too, and the output is rounded once to q's dtype.
A query row that may see no key gets output 0 and lse −inf, and no gradient flows through it. Masked means
absent: keys and values a query may not see (outside its window, in another sequence, past the last offset)
reach neither its output nor any gradient, even when they hold NaN or Inf.
Gradients are the softmax backward written out (what autodiff of the forward gives, with masked entries and
empty rows differentiating to exact zeros instead of NaN), from probabilities recomputed from the saved lse; on
the CPU, calls without a mask or bias compute them in blocks of keys (:func:`_attend_unmasked`).
With bfloat16 q, k and v, products of two bf16-valued operands (q·k, dout·v) are bf16 dots with float32
accumulation (exact products); on GPUs the products with a float32 operand (probabilities, their gradients) run
on the bf16 tensor cores too, that operand as two bf16 parts, 16 significant bits instead of 24 (see
:func:`_product`); on the CPU, and for other dtypes, those are float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

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
                   additive=additive, dropout_seed=dropout_seed, dropout_p=dropout_p,
                   key_range=functools.partial(_window_key_range, window=window, offset=sk - sq, sk=sk))


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
    seg_q, pos_q = segments(cu_seqlens_q, q.shape[0])
    seg_k, pos_k = segments(cu_seqlens_k, k.shape[0])
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
                       additive=additive, dropout_seed=dropout_seed, dropout_p=dropout_p,
                       key_range=lambda first, end: (0, k.shape[0]))
    return out[0], lse[0]


def _constant_slopes(alibi_slopes: jax.Array) -> jax.Array:
    # ALiBi slopes are fixed hyperparameters, not trained: as in flash-attn, they get no gradient.
    return lax.stop_gradient(alibi_slopes.astype(jnp.float32))


def segments(cu_seqlens: jax.Array, total: int) -> tuple[jax.Array, jax.Array]:
    """Per token: the sequence it belongs to (``B`` when past the last one) and its position in it."""
    tokens = jnp.arange(total, dtype=cu_seqlens.dtype)
    # side="right" skips empty sequences, whose start equals the next one's. The unrolled search has no while
    # loop, which a GPU program runs as one launch sequence per step.
    seg = jnp.searchsorted(cu_seqlens[1:], tokens, side="right", method="scan_unrolled")
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


def _window_key_range(first: int, end: int, *, window: tuple[int, int], offset: int, sk: int) -> tuple[int, int]:
    """The keys ``[lo, hi)`` that query rows ``[first, end)`` may see under ``window`` (bottom-right aligned:
    row i sits at key position i + offset); at least one key, so that a range the window empties still has
    the shapes of attention (its rows see none of it)."""
    left, right = window
    lo = 0 if left < 0 else min(max(first + offset - left, 0), sk - 1)
    hi = sk if right < 0 else min(max(end - 1 + offset + right + 1, lo + 1), sk)
    return lo, max(hi, lo + 1)


def _grouped(x: jax.Array, kv_heads: int, groups: int) -> jax.Array:
    """``[B', H', Sq', Sk']`` with H' in {1, Hq} -> ``[B', Hk|1, G|1, Sq', Sk']`` to match grouped logits."""
    if x.shape[1] == 1:
        return x[:, :, None]
    return x.reshape(x.shape[0], kv_heads, groups, *x.shape[2:])


# Queries per block of the chunked form on GPUs and on the CPU: with more queries than this (and no dropout), each
# block of queries is attended on its own, so neither pass holds the [Sq, Sk] float32 logits of a head at once,
# only [chunk, Sk]. The CPU's smaller blocks keep a block's logits in its caches (docs/attention.md, "Reference
# speed"); its backward without a mask runs over blocks of as many keys.
QUERY_CHUNK = 512
CPU_QUERY_CHUNK = 128
# The blocks are mapped in at most this many groups of consecutive blocks, each over the keys its window lets
# its queries see: a causal call computes (groups + 1) / (2 groups) of the logits instead of all of them.
KEY_RANGE_GROUPS = 4


class _Statics(NamedTuple):
    scale: float
    softcap: float
    dropout_p: float
    bf16_values: bool  # q, k, v (and so the output's cotangent) are bfloat16: their values are exact in bf16


def _attend(q, k, v, *, scale, softcap, allowed, additive, dropout_seed, dropout_p, key_range):
    """Masked softmax attention on ``[B, S, H, D]`` tensors, with MQA/GQA by grouping query heads.

    ``allowed`` and ``additive`` are ``[B|1, Hq|1, Sq|1, Sk]``; ``key_range(first, end)`` bounds the keys that
    query rows ``[first, end)`` may see (static integers). The work is done head-major (q
    ``[B, Hk, G, Sq, D]``, k and v ``[B, Hk, Sk, D]``): the products then batch over leading axes and the
    float32 logits come out in the layout the softmax reads, where the sequence-major layout transposes them.
    Long query sequences without dropout are attended in blocks of :data:`QUERY_CHUNK` queries
    (:data:`CPU_QUERY_CHUNK` on the CPU; a ``lax.map``):
    every query row is computed by the same formulas, equal to the unblocked form up to float32 summation order.
    With dropout the whole [Sq, Sk] grid is kept, because the dropout mask is drawn over it. On the CPU, without a
    mask or bias, the backward runs over blocks of keys instead (:func:`_attend_unmasked`).
    """
    batch, sq, q_heads, _ = q.shape
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    statics = _Statics(float(scale), float(softcap), float(dropout_p),
                       all(x.dtype == jnp.bfloat16 for x in (q, k, v)))
    qh = jnp.transpose(q.reshape(batch, sq, kv_heads, groups, q.shape[-1]), (0, 2, 3, 1, 4))
    kh, vh = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))
    allowed = None if allowed is None else _grouped(allowed, kv_heads, groups)
    additive = None if additive is None else _grouped(additive, kv_heads, groups)

    def attend(chunk):
        if dropout_p > 0 or sq <= chunk:
            return lambda *operands: _attend_block(statics, *operands, dropout_seed)
        return lambda *operands: _attend_chunked(statics, *operands, key_range, chunk)

    def attend_cpu(*operands):
        if additive is None and allowed is None:
            return _attend_unmasked(statics, *operands[:3], CPU_QUERY_CHUNK)
        return attend(CPU_QUERY_CHUNK)(*operands)

    operands = (qh, kh, vh, additive, allowed)
    if dropout_p > 0 or sq <= min(QUERY_CHUNK, CPU_QUERY_CHUNK):
        out, lse = attend(QUERY_CHUNK)(*operands)
    else:
        out, lse = lax.platform_dependent(*operands, cpu=attend_cpu, default=attend(QUERY_CHUNK))
    out = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(batch, sq, q_heads, v.shape[-1])
    return out, lse.reshape(batch, q_heads, sq)


def _attend_chunked(statics, qh, kh, vh, additive, allowed, key_range, chunk):
    """:func:`_attend_block` over blocks of ``chunk`` queries, mapped in groups of consecutive blocks over the
    keys ``key_range`` lets each group see (the others are masked for all of its rows)."""
    sq = qh.shape[3]
    chunks = -(-sq // chunk)
    pad = chunks * chunk - sq

    def padded(x):
        if x is None or x.shape[3] == 1:
            return x
        return jnp.pad(x, [(0, pad if a == 3 else 0) for a in range(x.ndim)])

    # Padded query rows are cut off at the end; they see no key (so they stay finite) when there is a mask.
    qh, additive, allowed = padded(qh), padded(additive), padded(allowed)
    # At least two blocks per group: XLA inlines a loop of one iteration, and inlined blocks are not kept from
    # running side by side (with their logits all alive at once).
    groups = max(1, min(KEY_RANGE_GROUPS, chunks // 2))
    bounds = [chunks * g // groups for g in range(groups + 1)]
    spans = []  # (first block, end block, key range), groups with the same keys merged
    for first, end in zip(bounds[:-1], bounds[1:]):
        keys = key_range(first * chunk, min(end * chunk, sq))
        if spans and spans[-1][2] == keys:
            spans[-1] = (spans[-1][0], end, keys)
        else:
            spans.append((first, end, keys))
    outs, lses = [], []
    for first, end, keys in spans:
        rows, keys = slice(first * chunk, end * chunk), slice(*keys)

        def part(x):
            if x is None:
                return None
            x = x if x.shape[3] == 1 else x[:, :, :, rows]
            return x if x.shape[-1] == 1 else x[..., keys]

        out, lse = _map_blocks(statics, qh[:, :, :, rows], kh[:, :, keys], vh[:, :, keys], part(additive),
                               part(allowed), chunk)
        outs.append(out)
        lses.append(lse)
    return jnp.concatenate(outs, axis=3)[:, :, :, :sq], jnp.concatenate(lses, axis=3)[..., :sq]


def _map_blocks(statics, qh, kh, vh, additive, allowed, chunk):
    """:func:`_attend_block` over the ``chunk``-query blocks of qh (a multiple of them)."""
    return _map_query_blocks(lambda q, add, allow: _attend_block(statics, q, kh, vh, add, allow, None), chunk, qh,
                             additive, allowed)


def _map_query_blocks(block, chunk, *arrays):
    """``lax.map`` of ``block`` over the ``chunk``-query blocks of ``arrays`` (query axis 3, a multiple of ``chunk``
    long; None or a broadcast query axis is passed whole to every block). ``block``'s results have their query
    axis at 3 too; they come back joined along it."""
    blocks = next(x.shape[3] for x in arrays if x is not None and x.shape[3] != 1) // chunk

    def split(x):
        """x's query axis split into [blocks, ...]; None for a broadcast query axis."""
        if x is None or x.shape[3] == 1:
            return None
        return jnp.moveaxis(x.reshape(*x.shape[:3], blocks, chunk, *x.shape[4:]), 3, 0)

    per_block = tuple(split(x) for x in arrays)
    whole = tuple(x if part is None else None for x, part in zip(arrays, per_block))

    def mapped(parts):
        return block(*(x if part is None else part for x, part in zip(whole, parts)))

    return tuple(jnp.moveaxis(r, 0, 3).reshape(*r.shape[1:4], blocks * chunk, *r.shape[5:])
                 for r in lax.map(mapped, per_block))


# The block's gradient is the softmax backward written out (as flash attention computes it: the probabilities
# recomputed from the saved lse), where autodiff of the forward would save or rematerialize every [Sq, Sk]
# intermediate of the masking and normalization and run an elementwise pass for each. It gives what autodiff of
# the forward gives, masked and empty rows included.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend_block(statics, qh, kh, vh, additive, allowed, dropout_seed):
    """Head-major attention: q ``[B, Hk, G, Sq, D]``, k and v ``[B, Hk, Sk, D]``, ``additive`` and ``allowed``
    grouped ``[B|1, Hk|1, G|1, Sq|1, Sk]``. Returns out ``[B, Hk, G, Sq, Dv]`` in q's dtype and lse
    ``[B, Hk, G, Sq]``."""
    out, lse, _ = _block_forward(statics, qh, kh, vh, additive, allowed, dropout_seed)
    return out, lse


def _block_forward(statics, qh, kh, vh, additive, allowed, dropout_seed):
    logits, _, _ = _masked_logits(statics, qh, kh, additive, allowed)
    # The row maximum only stabilizes exp; an empty row has maximum -inf and is shifted by 0 instead, which
    # keeps exp(-inf) = 0.
    row_max = jnp.max(logits, axis=-1, keepdims=True, initial=-jnp.inf)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    probs = jnp.exp(logits - row_max)
    row_sum = jnp.sum(probs, axis=-1, keepdims=True)
    nonempty = row_sum > 0
    # An empty row's sum counts as 1, which leaves its (zero) probabilities as they are.
    safe_sum = jnp.where(nonempty, row_sum, 1.0)
    lse = jnp.where(nonempty, row_max + jnp.log(safe_sum), -jnp.inf)[..., 0]
    weights = _dropped(statics, probs / safe_sum, dropout_seed)
    out, replaced = _weighted_values(statics, weights, vh, allowed)
    return out.astype(qh.dtype), lse, (out, replaced)


def _attend_block_fwd(statics, qh, kh, vh, additive, allowed, dropout_seed):
    out, lse, (out32, replaced) = _block_forward(statics, qh, kh, vh, additive, allowed, dropout_seed)
    return (out, lse), (qh, kh, vh, additive, allowed, dropout_seed, lse, out32, replaced)


def _attend_block_bwd(statics, residuals, cotangents):
    qh, kh, vh, additive, allowed, dropout_seed, lse, out32, replaced = residuals
    dout, dlse = cotangents
    logits, tanh, finite_key = _masked_logits(statics, qh, kh, additive, allowed)
    # lse is -inf exactly for the rows whose forward normalized by 1 (empty, or NaN from an allowed non-finite
    # key); their probabilities are exp(logits - 0), as in the forward, and neither lse nor the normalization
    # passes a gradient.
    nonempty = lse > -jnp.inf
    probs = jnp.exp(logits - jnp.where(nonempty, lse, 0.0)[..., None])
    weights = _dropped(statics, probs, dropout_seed)
    # Output elements the non-finite values replaced (NaN, ±Inf) do not depend on the weights.
    dout = jnp.where(replaced, 0.0, dout.astype(jnp.float32))
    values = vh if allowed is None else jnp.where(jnp.isfinite(vh), vh, 0)
    exact = statics.bf16_values
    dweights = _product("bhgqd,bhkd->bhgqk", dout, values, exact, exact)
    dprobs = _dropped(statics, dweights, dropout_seed)
    # Σ_k p·dp over a row equals dout·out (with or without dropout), a sum over Dv instead of Sk.
    row_term = jnp.sum(dout * jnp.where(replaced, 0.0, out32), axis=-1) - dlse
    dlogits = probs * (dprobs - jnp.where(nonempty, row_term, 0.0)[..., None])
    if allowed is not None:
        # Masked logits and those of non-finite keys were replaced by constants: no gradient reaches them.
        dlogits = jnp.where(allowed & finite_key[:, :, None, None, :], dlogits, 0.0)
    dadditive = None if additive is None else _sum_to_shape(dlogits, additive.shape)
    dscores = dlogits if tanh is None else dlogits * (1.0 - tanh * tanh)
    dscores = dscores * statics.scale
    keys = kh if finite_key is None else jnp.where(finite_key[..., None], kh, 0)
    dq = _product("bhgqk,bhkd->bhgqd", dscores, keys, False, exact)
    dk = _product("bhgqk,bhgqd->bhkd", dscores, qh, False, exact)
    dv = _product("bhgqk,bhgqd->bhkd", weights, dout, False, exact)
    if allowed is not None:
        dk = jnp.where(finite_key[..., None], dk, 0.0)
        dv = jnp.where(jnp.isfinite(vh), dv, 0.0)
    return dq.astype(qh.dtype), dk.astype(kh.dtype), dv.astype(vh.dtype), dadditive, None, None


_attend_block.defvjp(_attend_block_fwd, _attend_block_bwd)


# Attention without a mask, bias or dropout, for the CPU: the forward in blocks of ``chunk`` queries, the backward
# in blocks of ``chunk`` keys. Over query blocks, dk and dv are sums of one product per block, each contracting
# only its ``chunk`` queries (float32 products of that shape run at about half the speed of long ones on the CPU),
# and the products with the transposed probabilities and logit gradients copy each block's [chunk, Sk] grid to
# transpose it. Over key blocks, dk and dv are one product over all queries each, the logits come out key-major
# ([B, Hk, chunk, G, Sq]), the layout all three products read, and only dq is a sum over blocks (in float32).
# Neither pass holds more than a block's [chunk, Sk] or [chunk, G·Sq] logits.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 4))
def _attend_unmasked(statics, qh, kh, vh, chunk):
    """:func:`_attend_block` without ``additive`` or ``allowed``, for any number of queries."""
    out, lse, _ = _unmasked_forward(statics, qh, kh, vh, chunk)
    return out, lse


def _unmasked_forward(statics, qh, kh, vh, chunk):
    """:func:`_block_forward` over blocks of ``chunk`` queries (the last one padded): out, lse and out in float32."""
    sq = qh.shape[3]
    qh = jnp.pad(qh, [(0, -sq % chunk if a == 3 else 0) for a in range(qh.ndim)])

    def block(q_block):
        out, lse, (out32, _) = _block_forward(statics, q_block, kh, vh, None, None, None)
        return out, lse, out32

    return tuple(x[:, :, :, :sq] for x in _map_query_blocks(block, chunk, qh))


def _attend_unmasked_fwd(statics, qh, kh, vh, chunk):
    out, lse, out32 = _unmasked_forward(statics, qh, kh, vh, chunk)
    return (out, lse), (qh, kh, vh, lse, out32)


def _attend_unmasked_bwd(statics, chunk, residuals, cotangents):
    """:func:`_attend_block_bwd`'s formulas without a mask, over blocks of ``chunk`` keys (and the rest)."""
    qh, kh, vh, lse, out32 = residuals
    dout, dlse = cotangents
    exact = statics.bf16_values
    # Row terms broadcast over key-major grids [B, Hk, keys, G, Sq].
    nonempty = lse > -jnp.inf
    row_shift = jnp.where(nonempty, lse, 0.0)[:, :, None]
    dout32 = dout.astype(jnp.float32)
    row_term = jnp.where(nonempty, jnp.sum(dout32 * out32, axis=-1) - dlse, 0.0)[:, :, None]
    # q and dout with their features before the queries ([B, Hk, D, G, Sq]), the layout the key-major products
    # read: transposed once here instead of once per block.
    q_features, dout_features = (jnp.moveaxis(x, -1, 2) for x in (qh, dout))

    def keys_block(dq_features, keys_values):
        keys, values = keys_values
        logits, tanh = _soft_capped(statics, _product("bhkd,bhdgq->bhkgq", keys, q_features, exact, exact)
                                    * statics.scale)
        probs = jnp.exp(logits - row_shift)
        dprobs = _product("bhkd,bhdgq->bhkgq", values, dout_features, exact, exact)
        dlogits = probs * (dprobs - row_term)
        dscores = (dlogits if tanh is None else dlogits * (1.0 - tanh * tanh)) * statics.scale
        dq_features = dq_features + _product("bhkd,bhkgq->bhdgq", keys, dscores, exact, False)
        dk = _product("bhkgq,bhgqd->bhkd", dscores, qh, False, exact)
        dv = _product("bhkgq,bhgqd->bhkd", probs, dout32, False, exact)
        return dq_features, (dk, dv)

    sk = kh.shape[2]
    blocks = sk // chunk
    whole = blocks * chunk

    def split(x):
        return jnp.moveaxis(x[:, :, :whole].reshape(*x.shape[:2], blocks, chunk, x.shape[-1]), 2, 0)

    def unsplit(x):
        return jnp.moveaxis(x, 0, 2).reshape(*x.shape[1:3], whole, x.shape[-1])

    dq_features = jnp.zeros(q_features.shape, jnp.float32)
    dq_features, (dk, dv) = lax.scan(keys_block, dq_features, (split(kh), split(vh)))
    dk, dv = unsplit(dk), unsplit(dv)
    if whole < sk:
        dq_features, (dk_rest, dv_rest) = keys_block(dq_features, (kh[:, :, whole:], vh[:, :, whole:]))
        dk, dv = jnp.concatenate([dk, dk_rest], axis=2), jnp.concatenate([dv, dv_rest], axis=2)
    dq = jnp.moveaxis(dq_features, 2, -1)
    return dq.astype(qh.dtype), dk.astype(kh.dtype), dv.astype(vh.dtype)


_attend_unmasked.defvjp(_attend_unmasked_fwd, _attend_unmasked_bwd)


def _masked_logits(statics, qh, kh, additive, allowed):
    """Logits ``[B, Hk, G, Sq, Sk]`` with bias and masks; also tanh of the soft-capped scores (for their
    derivative) and, with a mask, which keys are finite ``[B, Hk, Sk]``."""
    finite_key = None
    if allowed is not None:
        # Masked means absent: a key no query may see must not reach any output or gradient, even when it holds
        # NaN or Inf (a masked product 0 * NaN would). Logits come from the finite keys; a key with a non-finite
        # element gives a NaN logit, and only where it is allowed.
        finite_key = jnp.all(jnp.isfinite(kh), axis=-1)
        kh = jnp.where(finite_key[..., None], kh, 0)
    exact = statics.bf16_values
    logits, tanh = _soft_capped(statics, _product("bhgqd,bhkd->bhgqk", qh, kh, exact, exact) * statics.scale)
    if additive is not None:
        logits = logits + additive
    if allowed is not None:
        logits = jnp.where(finite_key[:, :, None, None, :], logits, jnp.nan)
        logits = jnp.where(allowed, logits, -jnp.inf)
    return logits, tanh, finite_key


def _soft_capped(statics, scores):
    """Soft-capping (Gemma-style) bounds the scaled scores to (-softcap, softcap) before bias and masks. Returns the
    logits and their tanh (for its derivative; None without a cap)."""
    if statics.softcap > 0:
        tanh = jnp.tanh(scores / statics.softcap)
        return statics.softcap * tanh, tanh
    return scores, None


def _dropped(statics, weights, dropout_seed):
    """Dropout on the normalized probabilities (lse is that of the undropped softmax), scaled so that the
    expected output equals the output without dropout; the same for their cotangents."""
    if statics.dropout_p == 0:
        return weights
    batch, kv_heads, groups, sq, sk = weights.shape
    keep = _grouped(_keep_mask(dropout_seed, statics.dropout_p, (batch, kv_heads * groups, sq, sk)), kv_heads, groups)
    return jnp.where(keep, weights / (1.0 - statics.dropout_p), 0.0)


def _weighted_values(statics, weights, v, allowed):
    """``weights [B, Hk, G, Sq, Sk] @ v [B, Hk, Sk, Dv]`` in float32 where a value no query may see cannot reach
    the output: with non-finite values present, each output element is NaN (or ±Inf) exactly when an allowed
    key's value is, and the finite values' weighted sum otherwise. Returns the output and where non-finite
    values replaced it. The usual all-finite case costs one product."""
    exact = statics.bf16_values

    def product(weights, values):
        out = _product("bhgqk,bhkd->bhgqd", weights, values, False, exact)
        return out, jnp.zeros(out.shape, bool)

    if allowed is None:
        return product(weights, v)

    def with_non_finite(weights, v):
        finite = jnp.isfinite(v)
        out, _ = product(weights, jnp.where(finite, v, 0))
        seen = jnp.broadcast_to(allowed, weights.shape).astype(jnp.float32)
        # Counts of 0/1 marks: exact in bf16 whatever v's dtype.
        count = lambda marks: _product("bhgqk,bhkd->bhgqd", seen, marks.astype(v.dtype), True, True)  # noqa: E731
        nan, pos_inf, neg_inf = (count(marks) > 0 for marks in (jnp.isnan(v), v == jnp.inf, v == -jnp.inf))
        out = jnp.where(pos_inf, jnp.inf, jnp.where(neg_inf, -jnp.inf, out))
        return jnp.where(nan | (pos_inf & neg_inf), jnp.nan, out), nan | pos_inf | neg_inf

    return lax.cond(jnp.all(jnp.isfinite(v)), product, with_non_finite, weights, v)


def _product(subscripts, x, y, x_bf16, y_bf16):
    """A float32 einsum. When both operands hold bf16 values (``x_bf16``, ``y_bf16``), a bf16 dot with float32
    accumulation everywhere: its products are exact. When one of them does, on GPUs the bf16 tensor cores as
    well, the float32 operand as the sum of two bf16 parts (16 of its 24 significant bits), where float32
    products would run several times slower; on the CPU the operands are multiplied in float32."""

    def float32(x, y):
        # HIGHEST keeps float32 products exact on GPUs, where the default would round inputs to TF32/bf16.
        return jnp.einsum(subscripts, x.astype(jnp.float32), y.astype(jnp.float32), precision=lax.Precision.HIGHEST)

    if not (x_bf16 or y_bf16):
        return float32(x, y)

    def tensor_cores(x, y):
        terms = [jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)
                 for a in _bf16_parts(x, x_bf16) for b in _bf16_parts(y, y_bf16)]
        return functools.reduce(jnp.add, terms)

    if x_bf16 and y_bf16:
        return tensor_cores(x, y)
    return lax.platform_dependent(x, y, cpu=float32, default=tensor_cores)


def _bf16_parts(x, exact):
    if exact:
        return [x.astype(jnp.bfloat16)]
    high = x.astype(jnp.bfloat16)
    return [high, (x.astype(jnp.float32) - high.astype(jnp.float32)).astype(jnp.bfloat16)]


def _sum_to_shape(x, shape):
    return jnp.sum(x, axis=tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1), keepdims=True)


def _keep_mask(dropout_seed: jax.Array, dropout_p: float, shape: tuple[int, ...]) -> jax.Array:
    """Keep an element unless its Philox4x32 word falls below dropout_p·2³² (key = seed, counter from 0).

    XLA's RngBitGenerator with an explicit algorithm produces the same bits on every platform, compiles to one
    operation (threefry-based jax.random compiles several times slower on CPU), and Philox is the generator
    GPU attention kernels use for dropout.
    """
    state = jnp.concatenate([dropout_seed, jnp.zeros(2, jnp.uint32)])
    _, bits = lax.rng_bit_generator(state, shape, dtype=jnp.uint32, algorithm=lax.RandomAlgorithm.RNG_PHILOX)
    return bits >= jnp.uint32(int(dropout_p * 2**32))
