"""cuDNN flash attention through ``jax.nn.dot_product_attention(implementation="cudnn")``.

The ``supports_*`` checks accept only calls that cuDNN computes with the reference's semantics; everything else
(ALiBi, dropout, lse, windows cuDNN cannot express, …) falls back to the xla implementation. Differentiation
uses JAX's own cuDNN backward rule.
"""

from __future__ import annotations

import functools
import inspect
import os
import re

import jax
import jax.numpy as jnp

from jax_aiter.mha._contract import AttentionOptions
from jax_aiter.ref import mha as ref

try:  # jax's cuDNN attention module, for the packed layout jax.nn does not expose
    from jax._src.cudnn import fused_attention_stablehlo as _private_cudnn
except ImportError:
    _private_cudnn = None

_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# XLA flags under which cuDNN's attention backward runs deterministically (XLA's RequireDeterminism).
_DETERMINISM_FLAGS = re.compile(
    r"--xla_gpu_(?:deterministic_ops|exclude_nondeterministic_ops)(?:=(?:true|1))?(?=\s|$)")


def flash_attn(q, k, v, *optional, options: AttentionOptions):
    # ALiBi, dropout, determinism and lse are settled by supports_flash_attn.
    bias, _, _ = options.unpack(optional)
    if bias is not None:
        # cuDNN reads a full [1, Hq, Sq, Sk] bias; broadcasting here lets autodiff sum dbias back to bias's shape.
        bias = jnp.broadcast_to(bias, (1, q.shape[2], q.shape[1], k.shape[1]))
    return jax.nn.dot_product_attention(q, k, v, bias=bias, scale=options.softmax_scale, implementation="cudnn",
                                        **_mask_options(options.window))


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *optional, options: AttentionOptions):
    # Optional operands are all rejected by supports_flash_attn_varlen, so only q, k, v and offsets arrive.
    if _packed_layout_problem() is None:
        return _packed_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, options)
    return _padded_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, options)


def _packed_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, options: AttentionOptions):
    """cuDNN's packed (ragged-offset) layout: the tokens stay where they are, no copies.

    One extra segment pairs the queries after the last offset with the keys after it, as cuDNN leaves rows
    outside every segment unwritten. Rows of queries that see no key (that segment's, or a sequence's without
    keys) are then set to 0: cuDNN may leave them undefined, and with their cotangent zeroed by the same select
    they contribute nothing to any gradient.
    """
    total_q, total_k = q.shape[0], k.shape[0]
    q_offsets = jnp.concatenate([cu_seqlens_q, jnp.asarray([total_q], cu_seqlens_q.dtype)])
    k_offsets = jnp.concatenate([cu_seqlens_k, jnp.asarray([total_k], cu_seqlens_k.dtype)])
    len_k = jnp.diff(cu_seqlens_k)
    causal = options.window == (-1, 0)
    mask = _private_cudnn.MaskType.PADDING_CAUSAL if causal else _private_cudnn.MaskType.PADDING
    out = _private_cudnn.dot_product_attention(
        q[None], k[None], v[None], q_seqlen=jnp.diff(q_offsets)[None], kv_seqlen=jnp.diff(k_offsets)[None],
        q_offsets=q_offsets[None], kv_offsets=k_offsets[None], scale=options.softmax_scale, mask_type=mask)[0]
    sequence, _ = ref.segments(cu_seqlens_q, total_q)
    batch = len_k.shape[0]
    sees_keys = (sequence < batch) & (len_k[jnp.clip(sequence, 0, batch - 1)] > 0)
    return jnp.where(sees_keys[:, None, None], out, 0)


def _padded_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, options: AttentionOptions):
    """Before Hopper (no packed layout): through ``[B, max_seqlen, H, D]`` copies and back."""
    len_q = jnp.diff(cu_seqlens_q)
    len_k = jnp.diff(cu_seqlens_k)
    q_pad = _pad(q, cu_seqlens_q, len_q, options.max_seqlen_q)
    k_pad = _pad(k, cu_seqlens_k, len_k, options.max_seqlen_k)
    v_pad = _pad(v, cu_seqlens_k, len_k, options.max_seqlen_k)
    # Only keys are length-masked: padding query rows then stay finite (with full or causal masks they see
    # at least one key), so the backward pass, which reads every row of the output, never meets undefined
    # values. A sequence without keys is given one zero key for the same reason; its output is zeroed below.
    out = jax.nn.dot_product_attention(q_pad, k_pad, v_pad, scale=options.softmax_scale,
                                       key_value_seq_lengths=jnp.maximum(len_k, 1), implementation="cudnn",
                                       **_mask_options(options.window))
    out = jnp.where((len_k > 0)[:, None, None, None], out, 0)
    return _unpad(out, cu_seqlens_q, q.shape[0])


def supports_flash_attn(q, k, v, *optional, options: AttentionOptions):
    reason = _common_reason(q, k, v, options)
    if reason:
        return reason
    if options.window != (-1, -1) and q.shape[1] != k.shape[1]:
        return "cuDNN aligns causal/window masks top-left; bottom-right alignment with Sq != Sk needs xla"
    reason = _window_reason(options.window)
    if reason:
        return reason
    if options.has_bias:
        bias, _, _ = options.unpack(optional)
        if bias.dtype != q.dtype:
            return f"cuDNN needs the bias in q's dtype ({q.dtype}), got {bias.dtype}"
        if bias.shape[0] != 1:
            return "cuDNN's bias gradient needs a bias without a batch dimension (shape [1, ...])"
        if q.shape[1] % 2 or k.shape[1] % 2:
            return "cuDNN's backward with a bias needs even Sq and Sk"
    return None


def supports_flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *optional, options: AttentionOptions):
    reason = _common_reason(q, k, v, options)
    if reason:
        return reason
    window = options.window
    if options.has_bias:
        return "a bias in packed coordinates is not expressible for cuDNN"
    if options.max_seqlen_q == 0 or options.max_seqlen_k == 0:
        return "cuDNN needs max_seqlen_q and max_seqlen_k >= 1"
    if window not in ((-1, -1), (-1, 0)):
        # A left bound would leave padding query rows with no key, and their undefined values would reach the
        # backward pass (see flash_attn_varlen).
        return "cuDNN varlen here takes full or causal attention only"
    if window == (-1, 0) and not (cu_seqlens_k is cu_seqlens_q and options.max_seqlen_q == options.max_seqlen_k):
        # cuDNN's padded masks start every sequence's q and k at position 0 (top-left); only when q and k
        # share their offsets (self-attention) does that equal the bottom-right alignment.
        return "causal masks need cu_seqlens_k to be cu_seqlens_q (top-left = bottom-right alignment)"
    return None


def _common_reason(q, k, v, options: AttentionOptions) -> str | None:
    problem = _availability_problem()
    if problem:
        return problem
    if q.dtype not in _DTYPES:
        return f"cuDNN attention takes bfloat16/float16, got {q.dtype}"
    head_dim, limit = q.shape[-1], _max_head_dim()
    if head_dim % 8 or head_dim > limit:
        return f"cuDNN needs a head dim that is a multiple of 8 and <= {limit} on this GPU, got {head_dim}"
    if v.shape[-1] != head_dim:
        return "cuDNN needs v's head dim equal to q's"
    if options.has_alibi:
        return "cuDNN has no ALiBi"
    if options.softcap > 0:
        return "jax.nn.dot_product_attention has no logit soft-capping"
    if options.dropout_p > 0:
        return "jax.nn.dot_product_attention exposes no cuDNN dropout"
    if options.return_lse:
        return "jax.nn.dot_product_attention rounds cuDNN's lse to q's dtype; the contract is float32"
    if options.deterministic and not _DETERMINISM_FLAGS.search(os.environ.get("XLA_FLAGS", "")):
        return ("deterministic=True: cuDNN's backward is deterministic only with "
                "XLA_FLAGS=--xla_gpu_exclude_nondeterministic_ops=true; pass deterministic=False to use it")
    return None


def _window_reason(window: tuple[int, int]) -> str | None:
    left, right = window
    if right == -1 and left != -1:
        return "cuDNN has no left-only window without a causal bound"
    if right > 0:
        return "cuDNN has no right window"
    return None


def _mask_options(window: tuple[int, int]) -> dict:
    """jax.nn options for a window that _window_reason accepted: none, causal, or causal with a left bound."""
    left, right = window
    if right != 0:
        return {}
    return {"is_causal": True, "local_window_size": (left, 0) if left >= 0 else None}


def _pad(x: jax.Array, cu_seqlens: jax.Array, lengths: jax.Array, max_seqlen: int) -> jax.Array:
    """Packed ``[T, H, D]`` -> ``[B, max_seqlen, H, D]``, zero past each sequence's length."""
    del lengths  # implied by cu_seqlens
    return _padded(x, cu_seqlens, max_seqlen)


def _unpad(x: jax.Array, cu_seqlens: jax.Array, total: int) -> jax.Array:
    """``[B, max_seqlen, H, D]`` -> packed ``[T, H, D]``; tokens past the last sequence get 0."""
    return _packed(x, cu_seqlens, total)


# Padding and unpadding move each token between its packed row and its padded slot, and every other entry is
# zero: each is the other's transpose. Their VJPs say so, which makes each gradient a gather too, instead of
# the scatter-add autodiff derives from a gather (atomic adds, several times slower on an H200).
def _pad_gather(x, cu_seqlens, max_seqlen):
    lengths = jnp.diff(cu_seqlens)
    index = cu_seqlens[:-1, None] + jnp.arange(max_seqlen, dtype=cu_seqlens.dtype)[None, :]
    valid = jnp.arange(max_seqlen)[None, :] < lengths[:, None]
    gathered = x[jnp.clip(index, 0, x.shape[0] - 1)]
    return jnp.where(valid[:, :, None, None], gathered, 0)


def _packed_gather(x, cu_seqlens, total):
    batch, max_seqlen = x.shape[:2]
    seq, pos = ref.segments(cu_seqlens, total)
    # a token is in a padded slot when its sequence exists and its position is below max_seqlen (always, for
    # offsets the checks accepted)
    inside = (seq < batch) & (pos < max_seqlen)
    seq = jnp.clip(seq, 0, batch - 1)
    pos = jnp.clip(pos, 0, max_seqlen - 1)
    return jnp.where(inside[:, None, None], x[seq, pos], 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _padded_vjp(x, cu_seqlens, max_seqlen, total):
    return _pad_gather(x, cu_seqlens, max_seqlen)


def _padded_fwd(x, cu_seqlens, max_seqlen, total):
    return _pad_gather(x, cu_seqlens, max_seqlen), cu_seqlens


def _padded_bwd(max_seqlen, total, cu_seqlens, g):
    return _packed_vjp(g, cu_seqlens, max_seqlen, total), None


_padded_vjp.defvjp(_padded_fwd, _padded_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _packed_vjp(x, cu_seqlens, max_seqlen, total):
    return _packed_gather(x, cu_seqlens, total)


def _packed_fwd(x, cu_seqlens, max_seqlen, total):
    return _packed_gather(x, cu_seqlens, total), cu_seqlens


def _packed_bwd(max_seqlen, total, cu_seqlens, g):
    return _padded_vjp(g, cu_seqlens, max_seqlen, total), None


_packed_vjp.defvjp(_packed_fwd, _packed_bwd)


def _padded(x, cu_seqlens, max_seqlen):
    return _padded_vjp(x, cu_seqlens, max_seqlen, x.shape[0])


def _packed(x, cu_seqlens, total):
    return _packed_vjp(x, cu_seqlens, x.shape[1], total)


@functools.cache
def _availability_problem() -> str | None:
    """Why cuDNN attention cannot be traced in this process (no CUDA plugin, no cuDNN), or None."""
    spec = jax.ShapeDtypeStruct((1, 8, 1, 8), jnp.bfloat16)
    try:
        jax.eval_shape(functools.partial(jax.nn.dot_product_attention, implementation="cudnn"), spec, spec, spec)
    except (RuntimeError, NotImplementedError, ValueError) as err:
        return f"cuDNN attention is unavailable in this process: {err}"
    return None


@functools.cache
def _packed_layout_problem() -> str | None:
    """Why cuDNN's packed layout cannot serve varlen calls here, or None. jax.nn does not expose it; jax's own
    cuDNN module (private) does, for Hopper (sm_90) and later."""
    missing = f"jax {jax.__version__} has no packed cuDNN attention with the arguments used here"
    if _private_cudnn is None:
        return missing
    arguments = set(inspect.signature(_private_cudnn.dot_product_attention).parameters)
    mask_type = getattr(_private_cudnn, "MaskType", None)
    if (not {"q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "scale", "mask_type"} <= arguments
            or mask_type is None or not {"PADDING", "PADDING_CAUSAL"} <= set(mask_type.__members__)):
        return missing
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return "no CUDA device"
    if min(tuple(int(p) for p in d.compute_capability.split(".")) for d in devices) < (9, 0):
        return "cuDNN's packed layout needs sm_90 or later"
    return None


@functools.cache
def _max_head_dim() -> int:
    """cuDNN's flash kernels take head dims up to 256 from Hopper (sm_90) on and up to 128 before."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return 128
    capabilities = [tuple(int(p) for p in d.compute_capability.split(".")) for d in devices]
    return 256 if capabilities and min(capabilities) >= (9, 0) else 128
