"""Flash attention: ``flash_attn_func`` (BSHD) and ``flash_attn_varlen`` (packed THD).

Each public function checks its arguments, puts them in the op's canonical form (docs/attention.md, "Kernel
contract") and dispatches; implementations, declared at the end of this module in preference order: AITER on
ROCm and cuDNN on CUDA, each where it supports the call, then the pure-JAX reference everywhere. Semantics follow flash-attn: masks aligned to the
bottom-right corner, ALiBi on the same aligned distance, dropout on the normalized probabilities, lse of the
undropped softmax.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _backend
from jax_aiter.aiter import MHA_BWD, MHA_FWD, MHA_LIBRARY, MHA_VARLEN_BWD, MHA_VARLEN_FWD
from jax_aiter.mha import _aiter, _checks, _cudnn
from jax_aiter.mha._contract import FLASH_ATTN, FLASH_ATTN_VARLEN, AttentionOptions, pack_optional
from jax_aiter.ref import mha as ref


def flash_attn_func(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    bias: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
    dropout_key: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Attention over q ``[B, Sq, Hq, D]``, k ``[B, Sk, Hk, D]``, v ``[B, Sk, Hk, Dv]`` with Hq % Hk == 0.

    Args:
      dropout_p: probability of dropping an attention weight (static); needs ``dropout_key`` when > 0.
      softmax_scale: logit scale, default ``1/sqrt(D)``.
      causal: query i sees keys j <= i + Sk - Sq (bottom-right aligned); same as ``window_size[1] = 0``, and
        a right window given with it is folded to 0 (as flash-attn does).
      window_size: ``(left, right)``: query i sees keys i + Sk - Sq - left <= j <= i + Sk - Sq + right;
        a negative side leaves that side unbounded.
      softcap: when > 0, the scaled logits become ``softcap·tanh(logits / softcap)`` (Gemma-style soft-capping,
        before bias, ALiBi and masks, as flash-attn does); 0 (the default) leaves them unchanged.
      bias: added to the logits, broadcastable (numpy rules) to ``[B, Hq, Sq, Sk]``; differentiable.
      alibi_slopes: float32 ``[Hq]`` or ``[B, Hq]``; adds ``−slope·|i + Sk − Sq − j|`` to the logits.
      deterministic: require a backward pass with a fixed reduction order (implementations that cannot
        guarantee it are skipped). Default False, as in flash-attn: the fast kernels (cuDNN on NVIDIA, whose
        backward may accumulate dq in varying order) serve the call. On NVIDIA, ``True`` takes cuDNN only under
        ``XLA_FLAGS=--xla_gpu_exclude_nondeterministic_ops=true`` (its deterministic backward, ~1.3x the time),
        else the reference (docs/attention.md, "Determinism").
      return_lse: also return the float32 log-sum-exp of the (scaled, biased, masked) logits, ``[B, Hq, Sq]``;
        −inf for a query that sees no key.
      dropout_key: a ``jax.random.key`` (any implementation) or a raw uint32[2] threefry key.

    Returns ``out [B, Sq, Hq, Dv]`` in q's dtype, or ``(out, lse)``.
    """
    operands, params = flash_attn_call(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                       window_size=window_size, softcap=softcap, bias=bias, alibi_slopes=alibi_slopes,
                                       deterministic=deterministic, return_lse=return_lse, dropout_key=dropout_key)
    return _backend.dispatch(FLASH_ATTN, *operands, **params)


def flash_attn_varlen(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    bias: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
    dropout_key: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Attention over packed sequences: q ``[Tq, Hq, D]``, k ``[Tk, Hk, D]``, v ``[Tk, Hk, Dv]``.

    Sequence b is ``q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]`` against ``k[cu_seqlens_k[b]:cu_seqlens_k[b+1]]``
    (int32 offsets ``[B+1]``, starting at 0, nondecreasing; checked when not traced). ``max_seqlen_q/k`` are
    static ints bounding every sequence length. Masks and ALiBi use positions within each sequence, aligned
    bottom-right per sequence. ``bias`` is broadcastable to ``[Hq, Tq, Tk]`` in packed coordinates (only the
    blocks of each sequence are read); ``alibi_slopes`` is ``[Hq]`` or ``[B, Hq]``. Tokens past the last
    offset belong to no sequence (output 0, lse −inf). Other options are those of :func:`flash_attn_func`.

    Returns ``out [Tq, Hq, Dv]``, or ``(out, lse [Hq, Tq])``.
    """
    operands, params = flash_attn_varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=dropout_p,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap, bias=bias,
        alibi_slopes=alibi_slopes, deterministic=deterministic, return_lse=return_lse, dropout_key=dropout_key)
    return _backend.dispatch(FLASH_ATTN_VARLEN, *operands, **params)


# flash-attn's names for the same functions, and its packed layouts (q, k, v stacked on one axis).
flash_attn_varlen_func = flash_attn_varlen


def _unstack(name: str, packed: Any, rank: int, count: int) -> tuple[jax.Array, ...]:
    shape = _checks.core.check_rank(name, packed, rank)
    axis = rank - 3
    if shape[axis] != count:
        raise ValueError(f"{name} must have {count} on axis {axis} ({'q, k, v' if count == 3 else 'k, v'} stacked), "
                         f"got shape {shape}")
    packed = jnp.asarray(packed)
    return tuple(jnp.take(packed, i, axis=axis) for i in range(count))


def flash_attn_qkvpacked_func(qkv: jax.Array, *args: Any, **kwargs: Any):
    """:func:`flash_attn_func` on qkv ``[B, S, 3, H, D]``; further arguments as there."""
    return flash_attn_func(*_unstack("qkv", qkv, 5, 3), *args, **kwargs)


def flash_attn_kvpacked_func(q: jax.Array, kv: jax.Array, *args: Any, **kwargs: Any):
    """:func:`flash_attn_func` on q ``[B, Sq, Hq, D]`` and kv ``[B, Sk, 2, Hk, D]``; further arguments as there."""
    return flash_attn_func(q, *_unstack("kv", kv, 5, 2), *args, **kwargs)


def flash_attn_varlen_qkvpacked_func(qkv: jax.Array, cu_seqlens: jax.Array, max_seqlen: int, *args: Any,
                                     **kwargs: Any):
    """:func:`flash_attn_varlen` on qkv ``[T, 3, H, D]`` with one set of offsets for q and k."""
    q, k, v = _unstack("qkv", qkv, 4, 3)
    return flash_attn_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, *args, **kwargs)


def flash_attn_varlen_kvpacked_func(q: jax.Array, kv: jax.Array, cu_seqlens_q: jax.Array, cu_seqlens_k: jax.Array,
                                    max_seqlen_q: int, max_seqlen_k: int, *args: Any, **kwargs: Any):
    """:func:`flash_attn_varlen` on q ``[Tq, Hq, D]`` and kv ``[Tk, 2, Hk, D]``; further arguments as there."""
    k, v = _unstack("kv", kv, 4, 2)
    return flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, **kwargs)


def flash_attn_call(q, k, v, *, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, deterministic,
                    return_lse, dropout_key, softcap=0.0) -> tuple[tuple, dict[str, Any]]:
    """The checked operands and static parameters :func:`flash_attn_func` dispatches (for backend queries)."""
    _checks.check_qkv(q, k, v, rank=4)
    batch, seqlen_q, q_heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    bias_shape = None if bias is None else _checks.check_bias(bias, (batch, q_heads, seqlen_q, seqlen_k),
                                                              "[B, Hq, Sq, Sk]")
    optional, params = _common(batch, q_heads, head_dim, seqlen_q + seqlen_k, bias=bias, bias_shape=bias_shape,
                               dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                               window_size=window_size, alibi_slopes=alibi_slopes, deterministic=deterministic,
                               return_lse=return_lse, dropout_key=dropout_key, softcap=softcap)
    return (*_as_jax(q, k, v), *optional), params


def flash_attn_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, dropout_p,
                           softmax_scale, causal, window_size, bias, alibi_slopes, deterministic, return_lse,
                           dropout_key, softcap=0.0) -> tuple[tuple, dict[str, Any]]:
    """The checked operands and static parameters :func:`flash_attn_varlen` dispatches (for backend queries)."""
    _checks.check_qkv(q, k, v, rank=3)
    batch = _checks.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    max_seqlen_q = _checks.check_static_int("max_seqlen_q", max_seqlen_q, minimum=0)
    max_seqlen_k = _checks.check_static_int("max_seqlen_k", max_seqlen_k, minimum=0)
    _checks.check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q")
    _checks.check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k")
    tokens_q, q_heads, head_dim = q.shape
    bias_shape = None if bias is None else _checks.check_bias(bias, (q_heads, tokens_q, k.shape[0]), "[Hq, Tq, Tk]")
    optional, params = _common(batch, q_heads, head_dim, max_seqlen_q + max_seqlen_k, bias=bias,
                               bias_shape=bias_shape, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                               window_size=window_size, alibi_slopes=alibi_slopes, deterministic=deterministic,
                               return_lse=return_lse, dropout_key=dropout_key, softcap=softcap)
    params = {"options": dataclasses.replace(params["options"], max_seqlen_q=max_seqlen_q,
                                             max_seqlen_k=max_seqlen_k)}
    cu_q, cu_k = _as_jax(cu_seqlens_q, cu_seqlens_k)
    if cu_seqlens_k is cu_seqlens_q:
        cu_k = cu_q  # one offsets array for q and k tells implementations the sequences are the same
    return (*_as_jax(q, k, v), cu_q, cu_k, *optional), params


def _common(batch, q_heads, head_dim, window_span, *, bias, bias_shape, dropout_p, softmax_scale, causal, window_size,
            alibi_slopes, deterministic, return_lse, dropout_key, softcap):
    """Checks shared by both layouts, then (all checks passed) the canonical forms: the bias at the rank of
    its target (``bias_shape``), slopes as ``[B, Hq]``, the dropout seed, and the static parameters."""
    causal = _checks.check_flag("causal", causal)
    deterministic = _checks.check_flag("deterministic", deterministic)
    return_lse = _checks.check_flag("return_lse", return_lse)
    window = _checks.check_window(window_size, causal, window_span)
    softmax_scale = _checks.check_softmax_scale(softmax_scale, head_dim)
    softcap = _checks.check_softcap(softcap)
    dropout_p = _checks.check_dropout(dropout_p, dropout_key)
    if alibi_slopes is not None:
        _checks.check_alibi_slopes(alibi_slopes, batch, q_heads)
        alibi_slopes = jnp.broadcast_to(alibi_slopes, (batch, q_heads))
    if bias is not None:
        bias = jnp.reshape(bias, bias_shape)
    dropout_seed = _dropout_seed(dropout_key) if dropout_p > 0 else None
    options = AttentionOptions(softmax_scale=softmax_scale, window=window, has_bias=bias is not None,
                               has_alibi=alibi_slopes is not None, dropout_p=dropout_p, deterministic=deterministic,
                               return_lse=return_lse, softcap=softcap)
    return pack_optional(bias, alibi_slopes, dropout_seed), {"options": options}


def _as_jax(*arrays):
    """numpy operands become jax arrays, which implementations may index with traced values."""
    return tuple(jnp.asarray(x) if isinstance(x, np.ndarray) else x for x in arrays)


def _dropout_seed(dropout_key: jax.Array) -> jax.Array:
    """Two uint32 words drawn from the key: the one seed format every implementation takes."""
    if not jax.dtypes.issubdtype(dropout_key.dtype, jax.dtypes.prng_key):
        dropout_key = jax.random.wrap_key_data(dropout_key, impl="threefry2x32")
    return jax.random.bits(dropout_key, (2,), jnp.uint32)


# --- the xla implementation: the reference in the op's calling convention ------------------------------


def _xla_flash_attn(q, k, v, *optional, options: AttentionOptions):
    bias, alibi_slopes, dropout_seed = options.unpack(optional)
    out, lse = ref.attention(q, k, v, bias=bias, alibi_slopes=alibi_slopes, dropout_seed=dropout_seed,
                             softmax_scale=options.softmax_scale, softcap=options.softcap, window=options.window,
                             dropout_p=options.dropout_p)
    return (out, lse) if options.return_lse else out


def _xla_flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *optional, options: AttentionOptions):
    # The block-diagonal reference is exact for any lengths, so it needs neither maximum.
    bias, alibi_slopes, dropout_seed = options.unpack(optional)
    out, lse = ref.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, bias=bias, alibi_slopes=alibi_slopes,
                                    dropout_seed=dropout_seed, softmax_scale=options.softmax_scale,
                                    softcap=options.softcap, window=options.window, dropout_p=options.dropout_p)
    return (out, lse) if options.return_lse else out


def _flash_attn_example():
    """A causal GQA training step in bf16, with the public defaults otherwise (for ``jax_aiter.info()``)."""
    q = jax.ShapeDtypeStruct((2, 1024, 16, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 1024, 8, 128), jnp.bfloat16)
    return flash_attn_call(q, kv, kv, dropout_p=0.0, softmax_scale=None, causal=True, window_size=(-1, -1),
                           bias=None, alibi_slopes=None, deterministic=False, return_lse=False, dropout_key=None)


def _flash_attn_varlen_example():
    """Causal self-attention over 4 packed sequences of up to 1024 tokens, bf16, public defaults otherwise."""
    q = jax.ShapeDtypeStruct((4096, 16, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((4096, 8, 128), jnp.bfloat16)
    cu_seqlens = jax.ShapeDtypeStruct((5,), jnp.int32)
    return flash_attn_varlen_call(q, kv, kv, cu_seqlens, cu_seqlens, 1024, 1024, dropout_p=0.0,
                                  softmax_scale=None, causal=True, window_size=(-1, -1), bias=None,
                                  alibi_slopes=None, deterministic=False, return_lse=False, dropout_key=None)


def _all_finite(x: jax.Array) -> jax.Array:
    """Whether every element of x is finite, as one float32 sum: x * 0 is 0 for a finite element and NaN for
    NaN or ±Inf, and a NaN term makes the sum NaN. A plain summation is the reduction XLA emits at memory speed
    (a boolean all-reduce of isfinite measured several times slower on an H200)."""
    return jnp.isfinite(jnp.sum(x * jnp.zeros((), x.dtype), dtype=jnp.float32))


def _finite_or_zero(x: jax.Array) -> jax.Array:
    return jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype))


def _non_finite_kept_out(kernel, reference):
    """``kernel`` on keys and values whose non-finite elements are replaced by 0, and the reference's results
    wherever the reference's are not finite. Masked means absent: a key or value a query may not see must not
    reach its output or gradients, even when it is NaN or Inf, and a kernel that multiplies it by a zero weight
    would spread the NaN. So the kernel sees only finite keys and values: a query row that cannot see the
    replaced elements gets the kernel's own result, bit for bit the clean call's. A row that can see them gets
    the reference's NaN or Inf, computed in a forward conditional taken only when some key or value is not
    finite. The backward is the kernel's own, with no conditional: the gradients of a loss on the rows that
    cannot see a non-finite key or value are those of the clean call (the replaced elements' own gradients
    aside), and a NaN cotangent of a row that sees one spreads as through any kernel."""

    def attention(*operands, options: AttentionOptions):
        kernel_fn = functools.partial(kernel, options=options)
        reference_fn = functools.partial(reference, options=options)

        def finite_operands(q, k, v, *rest):
            return (q, _finite_or_zero(k), _finite_or_zero(v), *rest)

        def with_reference_where_not_finite(results, *operands):
            return jax.tree.map(lambda got, exact: jnp.where(jnp.isfinite(exact), got, exact), results,
                                reference_fn(*operands))

        def keep_out(results, operands):
            finite = _all_finite(operands[1]) & _all_finite(operands[2])
            return _cond_in_row_major(finite, lambda results, *_: results, with_reference_where_not_finite, results,
                                      *operands)

        @jax.custom_vjp
        def guarded(*operands):
            return keep_out(kernel_fn(*finite_operands(*operands)), operands)

        def forward(*operands):
            results, kernel_vjp = jax.vjp(kernel_fn, *finite_operands(*operands))
            return keep_out(results, operands), kernel_vjp

        guarded.defvjp(forward, lambda kernel_vjp, cotangents: kernel_vjp(cotangents))
        return guarded(*operands)

    return attention


def _cond_in_row_major(predicate, true_fn, false_fn, *operands):
    """``lax.cond`` whose operands and results cross the branch boundary as 1-D arrays. A conditional's results
    take one layout for both branches, and XLA picked the one the reference's code prefers: a compiled program
    (H200) transposed the kernel's results into it and back on every call. A 1-D array has a single layout, so
    any relayout happens inside the rarely taken branch."""
    leaves, tree = jax.tree.flatten(operands)
    results = jax.eval_shape(true_fn, *operands)
    result_leaves, result_tree = jax.tree.flatten(results)

    def branch(fn):
        def flat_fn(flat_leaves):
            args = tree.unflatten([x.reshape(leaf.shape) for x, leaf in zip(flat_leaves, leaves)])
            return [x.reshape(-1) for x in jax.tree.leaves(fn(*args))]
        return flat_fn

    flat = jax.lax.cond(predicate, branch(true_fn), branch(false_fn), [x.reshape(-1) for x in leaves])
    return result_tree.unflatten([x.reshape(leaf.shape) for x, leaf in zip(flat, result_leaves)])


# --- implementations ----------------------------------------------------------------------------------------

_backend.define_op(FLASH_ATTN, example=_flash_attn_example, implementations=(
    _backend.Implementation("aiter", _non_finite_kept_out(_aiter.flash_attn, _xla_flash_attn), platforms=("rocm",),
                            library=MHA_LIBRARY, targets=(MHA_FWD, MHA_BWD), supports=_aiter.supports_flash_attn),
    _backend.Implementation("cudnn", _non_finite_kept_out(_cudnn.flash_attn, _xla_flash_attn),
                            platforms=("cuda",), supports=_cudnn.supports_flash_attn),
    _backend.Implementation("xla", _xla_flash_attn),
))
_backend.define_op(FLASH_ATTN_VARLEN, example=_flash_attn_varlen_example, implementations=(
    _backend.Implementation("aiter", _non_finite_kept_out(_aiter.flash_attn_varlen, _xla_flash_attn_varlen),
                            platforms=("rocm",), library=MHA_LIBRARY, targets=(MHA_VARLEN_FWD, MHA_VARLEN_BWD),
                            supports=_aiter.supports_flash_attn_varlen),
    _backend.Implementation("cudnn", _non_finite_kept_out(_cudnn.flash_attn_varlen, _xla_flash_attn_varlen),
                            platforms=("cuda",), supports=_cudnn.supports_flash_attn_varlen),
    _backend.Implementation("xla", _xla_flash_attn_varlen),
))
