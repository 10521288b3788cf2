"""``silu_and_mul`` as this project's kernels (csrc/cpu/activation.cc, csrc/gpu/activation.cu; contract
csrc/include/jax_aiter/activation.h): forward and backward, float32 math."""

from __future__ import annotations

import jax

TARGETS = ("ja_silu_and_mul_fwd", "ja_silu_and_mul_bwd")


def _forward_call(x):
    out = jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
    return jax.ffi.ffi_call("ja_silu_and_mul_fwd", out, vmap_method="sequential")(x)


def _backward_call(dout, x):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call("ja_silu_and_mul_bwd", out, vmap_method="sequential")(dout, x)


@jax.custom_vjp
def silu_and_mul(x):
    return _forward_call(x)


silu_and_mul.defvjp(lambda x: (_forward_call(x), x), lambda x, dout: (_backward_call(dout, x),))
