"""``flash_attn`` and ``flash_attn_varlen`` on ROCm through AITER's MHA kernels (csrc/aiter/mha.cc over
``aiter::mha_fwd`` / ``aiter::mha_bwd``; ASM v3 where it fits, Composable Kernel otherwise). Compile-checked
and lowered here, not run on hardware here.

Forward and backward are AITER's. The backward writes dK/dV per query head; each group of Hq/Hk heads is summed
here in float32 (MQA/GQA). A gradient through the returned lse (rare: losses use ``out``) is not something
AITER's backward takes, so that part comes from the reference's autodiff; JAX's symbolic zeros tell the two
cases apart when tracing.

Not served (the reason shows in ``jax-aiter info``): additive bias and ALiBi (not wired to the contract's
broadcasting and gradients), dropout (AITER draws its masks from its own Philox stream, so they would differ
from every other backend's), head dims above 256 or not a multiple of 8, float32.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from jax_aiter.aiter import MHA_BWD, MHA_FWD, MHA_VARLEN_BWD, MHA_VARLEN_FWD, _support
from jax_aiter.mha._contract import AttentionOptions
from jax_aiter.ref import mha as ref

DTYPES = (jnp.bfloat16, jnp.float16)
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8


def _attributes(cfg: AttentionOptions) -> dict:
    return {"softmax_scale": np.float32(cfg.softmax_scale), "window_left": np.int32(cfg.window[0]),
            "window_right": np.int32(cfg.window[1])}


def _seqlen_attributes(cfg: AttentionOptions) -> dict:
    return {"max_seqlen_q": np.int32(cfg.max_seqlen_q), "max_seqlen_k": np.int32(cfg.max_seqlen_k)}


def _lse_shape(cfg: AttentionOptions, q) -> tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if cfg.varlen else (q.shape[0], q.shape[2], q.shape[1])


def _forward(cfg: AttentionOptions, q, k, v, cu_seqlens):
    out = jax.ShapeDtypeStruct((*q.shape[:-1], v.shape[-1]), q.dtype)
    lse = jax.ShapeDtypeStruct(_lse_shape(cfg, q), jnp.float32)
    if cfg.varlen:
        return jax.ffi.ffi_call(MHA_VARLEN_FWD, (out, lse), vmap_method="sequential")(
            q, k, v, *cu_seqlens, **_attributes(cfg), **_seqlen_attributes(cfg))
    return jax.ffi.ffi_call(MHA_FWD, (out, lse), vmap_method="sequential")(q, k, v, **_attributes(cfg))


def _backward(cfg: AttentionOptions, dout, q, k, v, out, lse, cu_seqlens):
    q_heads, kv_heads = q.shape[-2], k.shape[-2]
    per_q_head = (*k.shape[:-2], q_heads)
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((*per_q_head, k.shape[-1]), k.dtype),
               jax.ShapeDtypeStruct((*per_q_head, v.shape[-1]), v.dtype),
               jax.ShapeDtypeStruct(lse.shape, jnp.float32))  # D = rowsum(dO * O), AITER's workspace
    attrs = {**_attributes(cfg), "deterministic": cfg.deterministic}
    if cfg.varlen:
        dq, dk, dv, _ = jax.ffi.ffi_call(MHA_VARLEN_BWD, results, vmap_method="sequential")(
            dout, q, k, v, out, lse, *cu_seqlens, **attrs, **_seqlen_attributes(cfg))
    else:
        dq, dk, dv, _ = jax.ffi.ffi_call(MHA_BWD, results, vmap_method="sequential")(dout, q, k, v, out, lse, **attrs)
    if q_heads != kv_heads:
        group = q_heads // kv_heads

        def fold(d, like):
            grouped = d.reshape(*d.shape[:-2], kv_heads, group, d.shape[-1]).astype(jnp.float32)
            return grouped.sum(axis=-2).astype(like.dtype)

        dk, dv = fold(dk, k), fold(dv, v)
    return dq, dk, dv


def _reference_lse(cfg: AttentionOptions, cu_seqlens):
    """The lse output of the reference as a function of (q, k, v), for gradients through lse."""
    common = dict(bias=None, alibi_slopes=None, dropout_seed=None, softmax_scale=cfg.softmax_scale,
                  window=cfg.window, dropout_p=0.0)
    if cfg.varlen:
        return lambda q, k, v: ref.attention_varlen(q, k, v, *cu_seqlens, **common)[1]
    return lambda q, k, v: ref.attention(q, k, v, **common)[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: AttentionOptions, q, k, v, cu_seqlens):
    return _forward(cfg, q, k, v, cu_seqlens)


def _attention_fwd(cfg, q, k, v, cu_seqlens):
    # With symbolic zeros, primals arrive wrapped (CustomVJPPrimal).
    q, k, v = q.value, k.value, v.value
    cu_seqlens = tuple(c.value for c in cu_seqlens)
    out, lse = _forward(cfg, q, k, v, cu_seqlens)
    return (out, lse), (q, k, v, out, lse, cu_seqlens)


def _attention_bwd(cfg, residuals, cotangents):
    q, k, v, out, lse, cu_seqlens = residuals
    d_out, d_lse = cotangents
    grads = [jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)]
    if not isinstance(d_out, SymbolicZero):
        grads = list(_backward(cfg, d_out, q, k, v, out, lse, cu_seqlens))
    if not isinstance(d_lse, SymbolicZero):
        extra = jax.vjp(_reference_lse(cfg, cu_seqlens), q, k, v)[1](d_lse)
        grads = [g + e.astype(g.dtype) for g, e in zip(grads, extra)]
    return (*grads, tuple(None for _ in cu_seqlens))


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


def _kernel_options(options: AttentionOptions) -> AttentionOptions:
    """What the kernels' custom_vjp is keyed on: lse is always computed, so return_lse does not split it."""
    return dataclasses.replace(options, return_lse=False)


def flash_attn(q, k, v, *optional, options: AttentionOptions):
    del optional  # supports() admits only calls without bias, ALiBi or dropout
    out, lse = _attention(_kernel_options(options), q, k, v, ())
    return (out, lse) if options.return_lse else out


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *optional, options: AttentionOptions):
    del optional
    out, lse = _attention(_kernel_options(options), q, k, v, (cu_seqlens_q, cu_seqlens_k))
    return (out, lse) if options.return_lse else out


def _supports(q, k, v, options: AttentionOptions) -> str | None:
    if np.dtype(q.dtype) not in tuple(np.dtype(d) for d in DTYPES):
        return f"AITER's attention kernels take bfloat16 or float16, got {np.dtype(q.dtype)}"
    if options.softcap > 0:
        return "logit soft-capping is not wired to AITER's soft-cap argument"
    if options.has_bias or options.has_alibi:
        return "additive bias and ALiBi are not wired to AITER's bias arguments"
    if options.dropout_p > 0:
        return "AITER draws dropout masks from its own Philox stream, which differ from the contract's"
    for name, dim in (("q/k", q.shape[-1]), ("v", v.shape[-1])):
        if dim > MAX_HEAD_DIM or dim % HEAD_DIM_MULTIPLE:
            return (f"{name} head dim {dim}: AITER's kernels cover multiples of {HEAD_DIM_MULTIPLE} "
                    f"up to {MAX_HEAD_DIM}")
    # Element strides and offsets travel as int32; dK/dV are written per query head.
    per_q_head = math.prod(k.shape[:-2]) * q.shape[-2] * max(k.shape[-1], v.shape[-1])
    if max(math.prod(q.shape), math.prod(k.shape), math.prod(v.shape), per_q_head) >= 2**31:
        return "tensors of 2^31 or more elements overflow AITER's 32-bit strides"
    return _support.arch_problem()


def supports_flash_attn(q, k, v, *optional, options: AttentionOptions) -> str | None:
    return _supports(q, k, v, options)


def supports_flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *optional,
                               options: AttentionOptions) -> str | None:
    if max(options.max_seqlen_q, options.max_seqlen_k) >= 2**31:
        return "sequence lengths of 2^31 or more overflow AITER's 32-bit sizes"
    return _supports(q, k, v, options)
