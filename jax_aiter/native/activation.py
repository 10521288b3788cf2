"""``silu_and_mul`` as this project's kernels (csrc/cpu/activation.cc, csrc/gpu/activation.cu; contract
csrc/include/jax_aiter/activation.h): forward and backward, float32 math.

Differentiation is reverse mode, like every implementation of this op: the first derivative runs the backward
kernel, and each kernel call carries the reference's derivative, so gradients of gradients work too.
"""

from __future__ import annotations

import math

import jax

from jax_aiter._autodiff import kernel_forward_reference_backward, reverse_mode
from jax_aiter.ref import activation as ref

TARGETS = ("ja_silu_and_mul_fwd", "ja_silu_and_mul_bwd")


def _forward_kernel(x):
    out = jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
    return jax.ffi.ffi_call("ja_silu_and_mul_fwd", out, vmap_method="sequential")(x)


def _backward_kernel(dout, x):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call("ja_silu_and_mul_bwd", out, vmap_method="sequential")(dout, x)


def _backward_reference(dout, x):
    return jax.vjp(ref.silu_and_mul, x)[1](dout)[0]


_forward_call = kernel_forward_reference_backward(_forward_kernel, ref.silu_and_mul)
_backward_call = kernel_forward_reference_backward(_backward_kernel, _backward_reference)


@jax.custom_vjp
def _silu_and_mul(x):
    return _forward_call(x)


_silu_and_mul.defvjp(lambda x: (_forward_call(x), x), lambda x, dout: (_backward_call(dout, x),))


def silu_and_mul(x):
    if math.prod(x.shape) == 0:  # no kernel needed: the reference gives the same (empty) result
        return reverse_mode(ref.silu_and_mul)(x)
    return _silu_and_mul(x)

