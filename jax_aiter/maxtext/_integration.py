"""The MaxText side of ``jax_aiter.maxtext``: a ``Quantization`` whose dot_general runs a precision policy's
recipe through our GEMMs, attention through ``flash_attn_func``, and the two replacements of MaxText functions
that turn them on (:func:`enable`) and off (:func:`disable`). Nothing in MaxText's files changes.

MaxText hands every quantizable projection of a dense decoder (attention q/k/v/out, MLP wi/wo) to
``quant.dot_general_cls(mesh_axes=kernel_axes)()``, called as ``dot_general(inputs, kernel, ((lhs_contract,
rhs_contract), ((), ())))`` with the kernel ``[*K dims, *N dims]`` and its contracting dimensions first. Our ops
take ``a[..., K] @ b[N, K]^T``, so :func:`policy_dot_general` flattens the contracting and the free dimensions of
the kernel and transposes it to ``[N, K]``. The transpose is local to each device: under FSDP the kernel's
sharded K (or N) axis stays sharded, so the partitioning rules of ``gemm_fp4_bf16`` / ``gemm_fp8`` see the
weight ``[N, K]`` divided on a weight axis and gather its FP4 (or FP8) copy, never the bf16 weight.

The LM head (``logits_dense``) and the token embedder take no quantization object in MaxText, so they stay
MaxText's own BF16; a policy that quantizes them is refused rather than silently not honoured.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

import maxtext
from maxtext.common.common_types import MODEL_MODE_TRAIN, AttentionType
from maxtext.inference.kvcache import KVTensor
from maxtext.layers import attention_op, quantizations

from jax_aiter.gemm_fp4 import Mxfp4Recipe
from jax_aiter.maxtext._resolve import ATTENTION_KERNEL, MODES, TESTED_MAXTEXT_VERSIONS
from jax_aiter.mha import flash_attn_func
from jax_aiter.precision import PrecisionPolicy, Recipe, project

__all__ = ["AiterDotGeneral", "AiterQuantization", "check_maxtext_version", "disable", "enable", "enabled_policy",
           "policy_dot_general", "policy_for_mode"]


def check_maxtext_version() -> None:
    """Raise when MaxText's version is not one this integration was tested with: the functions it replaces
    (``quantizations.configure_quantization``, ``AttentionOp.apply_attention``) are private API."""
    version = maxtext.__version__
    if version not in TESTED_MAXTEXT_VERSIONS:
        raise RuntimeError(
            f"jax_aiter.maxtext was tested with MaxText {', '.join(TESTED_MAXTEXT_VERSIONS)}, not {version}: it "
            "replaces MaxText's quantizations.configure_quantization and AttentionOp.apply_attention, whose "
            f"signatures may differ there (pip install maxtext=={TESTED_MAXTEXT_VERSIONS[-1]})")


def check_policy(policy: PrecisionPolicy) -> None:
    """Refuse what MaxText's dense decoder cannot be made to do through its quantization object."""
    if not isinstance(policy, PrecisionPolicy):
        raise TypeError(f"policy must be a jax_aiter.precision.PrecisionPolicy, got {type(policy).__name__}")
    for role in ("lm_head", "embedding"):
        if getattr(policy, role) is not None:
            raise ValueError(f"policy.{role}: MaxText passes no quantization object to its {role} "
                             f"({'logits_dense' if role == 'lm_head' else 'token_embedder'}), which stays BF16; "
                             f"use a policy with {role}=None")
    if policy.bf16_first_blocks or policy.bf16_last_blocks or policy.bf16_last_fraction:
        raise ValueError("policy.bf16_first_blocks / bf16_last_blocks / bf16_last_fraction: MaxText builds every "
                         "decoder layer's projections from one quantization object without the layer's index (and "
                         "scans them as one body), so every block runs policy.linear; use 0 for all three (e.g. "
                         "PrecisionPolicy.mxfp4(bf16_last_fraction=0))")
    if isinstance(policy.linear, Mxfp4Recipe) and policy.linear.uses_stochastic_rounding:
        raise ValueError("policy.linear: a recipe with stochastic rounding needs a fresh key per step, and "
                         "MaxText's dot_general call carries none; use a round-to-nearest recipe")


def policy_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, recipe: Recipe) -> jax.Array:
    """``lax.dot_general(lhs, rhs, dimension_numbers)`` without batch dimensions, computed as ``project(x, w,
    recipe)`` with ``x = lhs[..., K]`` (lhs's contracting dimensions moved last and flattened) and ``w = [N, K]``
    (rhs's free dimensions flattened to N, its contracting ones to K). Output dimensions in dot_general's order:
    lhs's free dimensions, then rhs's."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    if tuple(lhs_batch) or tuple(rhs_batch):
        raise ValueError(f"dimension_numbers: batch dimensions {lhs_batch}, {rhs_batch} are not supported (a "
                         "projection contracts an activation with a weight)")
    lhs_contract = tuple(d % lhs.ndim for d in lhs_contract)
    rhs_contract = tuple(d % rhs.ndim for d in rhs_contract)
    lhs_free = tuple(d for d in range(lhs.ndim) if d not in lhs_contract)
    rhs_free = tuple(d for d in range(rhs.ndim) if d not in rhs_contract)
    k = math.prod(lhs.shape[d] for d in lhs_contract)
    free_shape = tuple(lhs.shape[d] for d in lhs_free)
    n_shape = tuple(rhs.shape[d] for d in rhs_free)
    x = jnp.transpose(lhs, lhs_free + lhs_contract).reshape(*free_shape, k)
    w = jnp.transpose(rhs, rhs_contract + rhs_free).reshape(k, math.prod(n_shape)).T
    return project(x, w, recipe).reshape(*free_shape, *n_shape)


class AiterDotGeneral(nn.Module):
    """The dot_general MaxText's ``DenseGeneral`` calls (a Linen module, as MaxText wraps it in ``ToNNX``): the
    projection through ``recipe``'s GEMM. Holds no variables."""

    recipe: Recipe

    def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
        # precision and preferred_element_type: MaxText passes None; the recipe fixes the arithmetic.
        del precision, preferred_element_type
        return policy_dot_general(lhs, rhs, dimension_numbers, self.recipe)


@dataclasses.dataclass
class AiterQuantization(quantizations.Quantization):
    """MaxText ``Quantization`` running every block projection through ``policy.linear``."""

    policy: PrecisionPolicy
    # The GEMMs draw no random numbers (stochastic recipes are refused), so MaxText may drop the bridge's rngs.
    needs_apply_rngs: ClassVar[bool] = False
    # Read by MaxText's in_serve_mode / in_convert_mode: this is a training mode.
    quant_mode: ClassVar[str] = "train"

    def __post_init__(self) -> None:
        check_policy(self.policy)

    def dot_general_cls(self, mesh_axes: tuple[str, ...] = ()):
        # mesh_axes (the kernel's logical axes) changes nothing: every block projection takes policy.linear.
        del mesh_axes
        return functools.partial(AiterDotGeneral, recipe=self.policy.linear)

    def einsum(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("jax_aiter.maxtext quantizes DenseGeneral projections (dense decoders such as "
                                  "Llama); MaxText's einsum path (MoE experts) is not supported")


# --- the replacements ----------------------------------------------------------------------------------------

_ORIGINALS: dict[str, Any] = {}
_STATE: dict[str, PrecisionPolicy] = {}


def enabled_policy() -> PrecisionPolicy | None:
    """The policy :func:`enable` installed, or None when jax-aiter is not enabled in MaxText."""
    return _STATE.get("policy")


def _configure_quantization(config, quant_mode_str: str = "train"):
    policy = _STATE["policy"]
    if policy.linear is None:
        return _ORIGINALS["configure_quantization"](config, quant_mode_str)
    if config.quantization:
        raise ValueError(f"quantization={config.quantization!r}: MaxText's own quantization and the jax-aiter "
                         "precision policy would both quantize the projections; leave quantization empty "
                         "(the policy passed to jax_aiter.maxtext.enable decides)")
    if quant_mode_str != "train":
        raise ValueError(f"quant_mode_str={quant_mode_str!r}: jax-aiter policies are training modes")
    return AiterQuantization(policy)


def check_attention_config(config) -> None:
    """attention=jax_aiter is causal attention over each whole row: refuse configs whose rows hold several
    segments (packed documents, or Megatron data with resets at end-of-document tokens)."""
    if config.packing:
        raise ValueError(f"packing=true: attention={ATTENTION_KERNEL} attends over each row as one causal "
                         "sequence; set packing=false")
    if config.grain_file_type in ("mmap", "mmap_npy") and config.reset_attention_mask:
        raise ValueError(f"reset_attention_mask=true: attention={ATTENTION_KERNEL} does not reset attention at "
                         "end-of-document tokens; set reset_attention_mask=false")


def _apply_attention(self, query, key, value, decoder_segment_ids, segment_positions, lengths, model_mode,
                     *args, **kwargs):
    if self.attention_kernel != ATTENTION_KERNEL:
        return _ORIGINALS["apply_attention"](self, query, key, value, decoder_segment_ids, segment_positions,
                                             lengths, model_mode, *args, **kwargs)
    check_attention_config(self.config)
    if model_mode != MODEL_MODE_TRAIN:
        raise ValueError(f"model_mode={model_mode!r}: attention={ATTENTION_KERNEL} serves training; use "
                         "attention=dot_product for prefill and decoding")
    if self.attention_type != AttentionType.GLOBAL:
        raise ValueError(f"attention_type={self.attention_type.value!r}: attention={ATTENTION_KERNEL} is global "
                         "causal attention")
    if kwargs.get("sinks") is not None or kwargs.get("record_max_logits"):
        raise ValueError(f"attention={ATTENTION_KERNEL} supports neither attention sinks nor record_max_logits")
    key = key.dequant() if isinstance(key, KVTensor) else key
    value = value.dequant() if isinstance(value, KVTensor) else value
    # MaxText folds 1/sqrt(head_dim) into the query projection's initializer, so the logits take no scale.
    out = flash_attn_func(query, key, value, softmax_scale=1.0, causal=True)
    # "context" is the name MaxText's remat policies save or offload for attention outputs.
    return checkpoint_name(out, "context"), None, None


def enable(policy: PrecisionPolicy | None = None) -> None:
    """Route MaxText's dense projections through ``policy`` (default BF16: MaxText's own projections) and
    ``attention=jax_aiter`` through ``flash_attn_func``. Calling it again replaces the policy."""
    check_maxtext_version()
    policy = PrecisionPolicy.bf16() if policy is None else policy
    check_policy(policy)
    _STATE["policy"] = policy
    if not _ORIGINALS:
        _ORIGINALS["configure_quantization"] = quantizations.configure_quantization
        _ORIGINALS["apply_attention"] = attention_op.AttentionOp.apply_attention
        quantizations.configure_quantization = _configure_quantization
        attention_op.AttentionOp.apply_attention = _apply_attention


def disable() -> None:
    """Put MaxText's functions back (a no-op when not enabled)."""
    if _ORIGINALS:
        quantizations.configure_quantization = _ORIGINALS.pop("configure_quantization")
        attention_op.AttentionOp.apply_attention = _ORIGINALS.pop("apply_attention")
    _STATE.clear()


def policy_for_mode(mode: str) -> PrecisionPolicy:
    """The precision policy of a recipe mode (``jax_aiter.maxtext.MODES``): ``PrecisionPolicy.mxfp4()`` with every
    block MXFP4 (MaxText's layers carry no index, so the default's BF16 share cannot be kept), ``.fp8()`` or
    ``.bf16()``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    return getattr(PrecisionPolicy, MODES[mode].constructor)(**MODES[mode].arguments)
