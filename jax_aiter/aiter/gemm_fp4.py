"""``gemm_fp4`` on ROCm gfx950 through AITER's a4w4 ASM kernels (csrc/aiter/gemm_fp4.cc).

The operands arrive in AITER's layout (docs/mxfp4.md): A plain, B and both scales shuffled; a B operand in the
plain layout (the linear's residual copies) is shuffled here, as only the kernels need it so. The kernels
write whole 32-row groups, so the output has ceil(M/32)*32 rows and the first M are returned. With split-K the
kernels add partial sums atomically: results are exact up to float32 summation order, as the op's contract
allows, but not bitwise repeatable across K-split choices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_aiter.aiter import GEMM_FP4, _support
from jax_aiter.ref import mxfp4 as ref

# AITER ships FP4 GEMM code objects for gfx950 only.
ARCHS = ("gfx950",)


def output_rows(m: int) -> int:
    return -(-m // 32) * 32


def gemm_fp4(a, b, a_scale, b_scale, *, b_layout: str = "gemm_b"):
    if b_layout == "plain":  # the kernels read B and its scales shuffled only
        b, b_scale = ref.shuffle_fp4(b), ref.shuffle_scales(b_scale)
    m = a.shape[0]
    out = jax.ShapeDtypeStruct((output_rows(m), b.shape[0]), jnp.bfloat16)
    return jax.ffi.ffi_call(GEMM_FP4, out, vmap_method="sequential")(a, b, a_scale, b_scale)[:m]


def supports(a, b, a_scale, b_scale, *, b_layout: str = "gemm_b") -> str | None:
    # Shapes and layouts were checked by jax_aiter.gemm_fp4.gemm_fp4; only the device is left to judge.
    return _support.arch_problem(ARCHS)

