"""``gemm`` on ROCm through AITER's a16w16 ASM kernels (csrc/aiter/gemm.cc); imported by jax_aiter.gemm.

The forward GEMM runs on AITER with float32 output, rounded to the input dtype by XLA: one rounding of a
float32 accumulation for every split-K choice, as the op's contract says (the kernels' bf16 output mode would
round each K split's partial sum). The backward GEMMs are XLA's (hipBLASLt on ROCm): they need A and B
transposed, which the [N, K]-only kernels would take as two extra copies.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import jax_aiter.gemm  # noqa: F401  (defines the op; either module may be imported first)
from jax_aiter import _backend
from jax_aiter.aiter import GEMM_BF16, LIBRARY, _support
from jax_aiter.ref import gemm as ref

# When M is smaller, A is zero-padded to this many rows, the largest tile_M in AITER's bf16 tables: the
# kernels load whole tile_M-row tiles of A without bounds (ROCm/aiter#5781).
MIN_A_ROWS = 256
# The split-K semaphore the kernels need: one u32 per output tile of a launch, 16 x 64 (zeroed by the handler).
SEMAPHORE_SHAPE = (16, 64)
# Every table's smallest tile_N: N must be a multiple of some tile_N, the kernels do not pad N.
N_MULTIPLE = 64


def _forward(a: jax.Array, b: jax.Array) -> jax.Array:
    k = a.shape[-1]
    n = b.shape[0]
    a2 = a.reshape(-1, k)
    m = a2.shape[0]
    a_rows = a2 if m >= MIN_A_ROWS else jnp.pad(a2, ((0, MIN_A_ROWS - m), (0, 0)))
    out, _ = jax.ffi.ffi_call(
        GEMM_BF16,
        (jax.ShapeDtypeStruct((m, n), jnp.float32), jax.ShapeDtypeStruct(SEMAPHORE_SHAPE, jnp.uint32)),
        vmap_method="sequential")(a_rows, b)
    return out.astype(a.dtype).reshape(*a.shape[:-1], n)


@jax.custom_vjp
def aiter_gemm(a: jax.Array, b: jax.Array) -> jax.Array:
    return _forward(a, b)


def _fwd(a, b):
    return _forward(a, b), (a, b)


def _bwd(residuals, g):
    a, b = residuals
    return jax.vjp(ref.gemm, a, b)[1](g)


aiter_gemm.defvjp(_fwd, _bwd)


def supports(a, b) -> str | None:
    if np.dtype(a.dtype) != np.dtype(jnp.bfloat16):
        return f"AITER's a16w16 kernels take bfloat16 only, got {np.dtype(a.dtype)}"
    k = a.shape[-1]
    n = b.shape[0]
    m = math.prod(a.shape[:-1])
    if k == 0 or k % 64:
        return f"K = {k} is not a positive multiple of 64 (the kernels load 128-bit slices of K)"
    if n % N_MULTIPLE:
        return f"N = {n} is not a multiple of {N_MULTIPLE} (the kernels do not pad N)"
    if m * n >= 2**31:
        return f"M*N = {m * n} >= 2^31 overflows the kernels' 32-bit output offsets"
    return _support.arch_problem()


_backend.register("gemm", "aiter", aiter_gemm, platforms=("rocm",), library=LIBRARY, supports=supports)
