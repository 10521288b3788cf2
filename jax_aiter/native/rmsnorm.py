"""``rms_norm`` and ``rms_norm_with_add`` as this project's kernels (csrc/cpu/rmsnorm.cc, csrc/gpu/rmsnorm.cu;
contract csrc/include/jax_aiter/rmsnorm.h): forward and backward, float32 math, exact for every finite input
(the rows whose float32 sum of squares overflows are summed scaled, as in the reference). The forward saves
``rms`` per row for the backward, under the checkpoint name ``rms_norm_rms`` (and ``rms_norm_with_add`` its sum
``x + residual`` under ``rms_norm_sum``), so a ``jax.checkpoint`` policy that saves them keeps the forward kernel
out of the recomputed backward pass. It saves ``rms`` rather than ``1/rms``: for finite x the rms is a normal
float32 (from sqrt(epsilon) >= 2^-63 to float32's largest value), where ``1/rms`` is subnormal above 2^126 and
XLA's CPU runtime flushes subnormals to zero.

Differentiation is reverse mode, like every implementation of these ops: the first derivative runs the backward
kernel, and each kernel call carries the reference's derivative, so gradients of gradients work too.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jax_aiter._autodiff import kernel_forward_reference_backward
from jax_aiter._autodiff import reverse_mode as _reverse_mode_reference
from jax_aiter.ref import rmsnorm as ref

# The GPU backward sums dgamma per thread block into a [blocks, cols] float32 workspace, then across blocks:
# at most this many blocks (one resident wave on an H200 or MI300), so the workspace stays a few percent of the
# traffic. XLA allocates it as a third output; the CPU kernel does not use it.
DGAMMA_MAX_BLOCKS = 512
# The FFI targets each op calls (the library must export them all).
RMS_NORM_TARGETS = ("ja_rms_norm_fwd", "ja_rms_norm_bwd")
RMS_NORM_WITH_ADD_TARGETS = ("ja_add_rms_norm_fwd", "ja_rms_norm_bwd")

# Checkpoint names of the residuals (jax.checkpoint_policies.save_only_these_names).
RMS_NAME = "rms_norm_rms"
SUM_NAME = "rms_norm_sum"


def _forward_kernel(x, gamma, *, epsilon):
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32))
    return jax.ffi.ffi_call("ja_rms_norm_fwd", out, vmap_method="sequential")(x, gamma, epsilon=np.float32(epsilon))


def _add_forward_kernel(x, residual, gamma, *, epsilon):
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype),
           jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32))
    return jax.ffi.ffi_call("ja_add_rms_norm_fwd", out, vmap_method="sequential")(
        x, residual, gamma, epsilon=np.float32(epsilon))


def _backward_kernel(dy, x, gamma, rms, d_sum, *, epsilon):
    del epsilon  # rms holds it
    rows = math.prod(x.shape[:-1])
    out = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(gamma.shape, gamma.dtype),
           jax.ShapeDtypeStruct((min(rows, DGAMMA_MAX_BLOCKS), x.shape[-1]), jnp.float32))
    dx, dgamma, _ = jax.ffi.ffi_call("ja_rms_norm_bwd", out, vmap_method="sequential")(dy, x, gamma, rms, d_sum)
    return dx, dgamma


def _forward_reference(x, gamma, *, epsilon):
    return ref.rms_norm(x, gamma, epsilon=epsilon), ref.row_rms(x, epsilon=epsilon)


def _add_forward_reference(x, residual, gamma, *, epsilon):
    y, total = ref.rms_norm_with_add(x, residual, gamma, epsilon=epsilon)
    return y, total, _forward_reference(total, gamma, epsilon=epsilon)[1]


def _backward_reference(dy, x, gamma, rms, d_sum, *, epsilon):
    # rms is a function of x wherever the kernels meet it, so recomputing it from x gives the same values and
    # the whole derivative through x.
    del rms
    dx, dgamma = jax.vjp(lambda x, gamma: ref.rms_norm(x, gamma, epsilon=epsilon), x, gamma)[1](dy)
    return (dx + d_sum.astype(dx.dtype) if d_sum.size else dx), dgamma


_forward_call = kernel_forward_reference_backward(_forward_kernel, _forward_reference)
_add_forward_call = kernel_forward_reference_backward(_add_forward_kernel, _add_forward_reference)
_backward_call = kernel_forward_reference_backward(_backward_kernel, _backward_reference)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_norm(x, gamma, epsilon):
    return _forward_call(x, gamma, epsilon=epsilon)[0]


def _rms_norm_fwd(x, gamma, epsilon):
    y, rms = _forward_call(x, gamma, epsilon=epsilon)
    return y, (x, gamma, checkpoint_name(rms, RMS_NAME))


def _rms_norm_bwd(epsilon, residuals, dy):
    x, gamma, rms = residuals
    return _backward_call(dy, x, gamma, rms, jnp.zeros((0,), x.dtype), epsilon=epsilon)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _rms_norm_with_add(x, residual, gamma, epsilon):
    y, total, _ = _add_forward_call(x, residual, gamma, epsilon=epsilon)
    return y, total


def _rms_norm_with_add_fwd(x, residual, gamma, epsilon):
    y, total, rms = _add_forward_call(x, residual, gamma, epsilon=epsilon)
    return (y, total), (checkpoint_name(total, SUM_NAME), gamma, checkpoint_name(rms, RMS_NAME))


def _rms_norm_with_add_bwd(epsilon, residuals, cotangents):
    total, gamma, rms = residuals
    dy, d_total = cotangents
    dx, dgamma = _backward_call(dy, total, gamma, rms, d_total, epsilon=epsilon)
    return dx, dx, dgamma


_rms_norm_with_add.defvjp(_rms_norm_with_add_fwd, _rms_norm_with_add_bwd)


# An input without elements needs no kernel: the reference gives the same (empty) result.


def rms_norm(x, gamma, *, epsilon):
    if math.prod(x.shape) == 0:
        return _reverse_mode_reference(ref.rms_norm)(x, gamma, epsilon=epsilon)
    return _rms_norm(x, gamma, epsilon)


def rms_norm_with_add(x, residual, gamma, *, epsilon):
    if math.prod(x.shape) == 0:
        return _reverse_mode_reference(ref.rms_norm_with_add)(x, residual, gamma, epsilon=epsilon)
    return _rms_norm_with_add(x, residual, gamma, epsilon)


def supports(x, *rest, epsilon) -> str | None:
    gamma = rest[-1]
    if np.dtype(gamma.dtype) != np.dtype(x.dtype):
        return f"gamma dtype {np.dtype(gamma.dtype)} differs from x dtype {np.dtype(x.dtype)}"
    return None
