"""``gemm_fp4``: the FP4 GEMM on pre-quantized AITER operands, as a dispatched op.

Implementations, declared at the end of this module: ``aiter`` (ROCm gfx950, AITER's ASM a4w4 kernels), ``native``
and ``xla``, the emulation: it unshuffles and dequantizes exactly, then on the CPU multiplies in float32, and on
GPUs (NVIDIA, gfx942) multiplies exact bf16 operands on the matrix units with float32 accumulation; one program
gives the same answer on every backend up to float32 summation order (docs/mxfp4.md, "The emulated GEMM").
``native`` is the GPU emulation with both operands dequantized by one kernel each (XLA's unshuffle reads
16-byte runs in transposed order), bit for bit the same; on the CPU the float32 emulation stays.
``gemm_fp4_plain_b`` is the same op with B in the plain layout, as ``gemm_fp4_bf16`` keeps its residual copies.

``gemm_bf16_fp4`` multiplies a bf16 A by an MXFP4 B, emulated as ``gemm_fp4`` is (B dequantized exactly, float32
accumulation): with A the values of an MXFP4 copy (a cast in layout "values") it gives ``gemm_fp4``'s bits without
A ever being packed. ``emulates_gemm_fp4`` says per platform whether ``gemm_fp4`` would emulate a call, i.e.
whether that form is available to a caller that casts A itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_aiter import _backend, _checks, native
from jax_aiter.aiter import GEMM_FP4
from jax_aiter.aiter import LIBRARY as AITER_LIBRARY
from jax_aiter.aiter import gemm_fp4 as aiter_impl
from jax_aiter.native import mxfp4 as native_impl
from jax_aiter.ref import mxfp4 as ref

__all__ = ["emulates_gemm_fp4", "gemm_bf16_fp4", "gemm_fp4", "gemm_fp4_plain_b"]


def gemm_fp4(a: jax.Array, b: jax.Array, a_scale: jax.Array, b_scale: jax.Array) -> jax.Array:
    """bf16 ``out[M, N] = A[M, K] . B[N, K]^T`` from MXFP4 operands in AITER's layout.

    ``a``: plain packed uint8 [M, K/2]; ``b``: shuffled packed uint8 [N, K/2] (N % 16 == 0, K % 64 == 0);
    ``a_scale`` / ``b_scale``: shuffled, zero-padded uint8 scales of [M, K/32] / [N, K/32]
    (see :func:`shuffle_scales`). These are exactly the "gemm_a" and "gemm_b" layouts of :func:`cast_mxfp4`.
    """
    return _checked_gemm(a, b, a_scale, b_scale, b_layout="gemm_b")


def gemm_fp4_plain_b(a: jax.Array, b: jax.Array, a_scale: jax.Array, b_scale: jax.Array) -> jax.Array:
    """:func:`gemm_fp4` with B and its scales in the plain layout (row-major, scales unpadded [N, K/32]): the
    GEMM of ``gemm_fp4_bf16``'s residual copies. Only the AITER implementation shuffles them; the emulations
    dequantize them as they are, so no program shuffles bytes that the next kernel unshuffles."""
    return _checked_gemm(a, b, a_scale, b_scale, b_layout="plain")


def _b_scale_shape(n: int, k: int, b_layout: str) -> tuple[int, int]:
    """The scales of an [n, k] B operand: row-major [n, k/32] in the plain layout, else padded and shuffled."""
    return (n, k // ref.BLOCK) if b_layout == "plain" else ref.padded_scale_shape(n, k // ref.BLOCK)


def _checked_gemm(a, b, a_scale, b_scale, *, b_layout: str) -> jax.Array:
    for name, value in (("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale)):
        _checks.check_dtype(name, value, (jnp.uint8,))
        _checks.check_rank(name, value, 2)
    m, half_k = a.shape
    n, b_half_k = b.shape
    if b_half_k != half_k:
        raise ValueError(f"b must be [N, K/2] with K/2 = {half_k} as in a, got shape {tuple(b.shape)}")
    if half_k % 32:
        raise ValueError(f"a: K/2 = {half_k} bytes per row must be a multiple of 32 (K a multiple of 64, "
                         "as the shuffled B layout needs)")
    if n % 16:
        raise ValueError(f"b: N = {n} rows must be a multiple of 16 for the shuffled layout")
    scale_cols = half_k * 2 // ref.BLOCK
    for name, value, rows, form, expected in (
            ("a_scale", a_scale, m, "shuffled", ref.padded_scale_shape(m, scale_cols)),
            ("b_scale", b_scale, n, "plain" if b_layout == "plain" else "shuffled",
             _b_scale_shape(n, 2 * half_k, b_layout))):
        if tuple(value.shape) != expected:
            raise ValueError(f"{name} must be the {form} scales of [{rows}, {scale_cols}], shape {expected}, "
                             f"got {tuple(value.shape)}")
    return _backend.dispatch("gemm_fp4", a, b, a_scale, b_scale, b_layout=b_layout)


def gemm_bf16_fp4(a: jax.Array, b: jax.Array, b_scale: jax.Array, *, b_layout: str = "gemm_b") -> jax.Array:
    """bf16 ``out[M, N] = A[M, K] . B[N, K]^T`` for a bf16 ``a`` and an MXFP4 ``b`` with ``b_scale``, in the
    "gemm_b" layout of :func:`gemm_fp4` or (``b_layout="plain"``) row-major with unpadded scales [N, K/32]:
    B dequantized exactly, products accumulated in float32, rounded once to bf16 (on the CPU in float32)."""
    _checks.check_dtype("a", a, (jnp.bfloat16,))
    for name, value in (("b", b), ("b_scale", b_scale)):
        _checks.check_dtype(name, value, (jnp.uint8,))
    m, k = _checks.check_rank("a", a, 2)
    n, half_k = _checks.check_rank("b", b, 2)
    _checks.check_rank("b_scale", b_scale, 2)
    if b_layout not in ("gemm_b", "plain"):
        raise ValueError(f"b_layout must be 'gemm_b' or 'plain', got {b_layout!r}")
    if 2 * half_k != k or k % ref.BLOCK:
        raise ValueError(f"b must be [N, K/2] with K = {k} as in a (a multiple of 32), got shape {tuple(b.shape)}")
    if b_layout == "gemm_b" and (n % 16 or k % 64):
        raise ValueError(f"b in layout 'gemm_b' needs N % 16 == 0 and K % 64 == 0, got N = {n}, K = {k}")
    expected = _b_scale_shape(n, k, b_layout)
    if tuple(b_scale.shape) != expected:
        raise ValueError(f"b_scale must have shape {expected} for b in layout {b_layout!r}, got "
                         f"{tuple(b_scale.shape)}")
    return _backend.dispatch("gemm_bf16_fp4", a, b, b_scale, b_layout=b_layout)


def emulates_gemm_fp4(m: int, n: int, k: int, b_layout: str) -> dict[str, bool]:
    """Per platform, whether :func:`gemm_fp4` of an [m, k] A and an [n, k] B in ``b_layout`` would take an
    emulation (the ``native`` or ``xla`` implementation) rather than AITER's FP4 kernels."""
    args = (jax.ShapeDtypeStruct((m, k // 2), jnp.uint8), jax.ShapeDtypeStruct((n, k // 2), jnp.uint8),
            jax.ShapeDtypeStruct(ref.padded_scale_shape(m, k // ref.BLOCK), jnp.uint8),
            jax.ShapeDtypeStruct(_b_scale_shape(n, k, b_layout), jnp.uint8))
    return {platform: _backend.select("gemm_fp4", platform, args, {"b_layout": b_layout}).name != "aiter"
            for platform in _backend.PLATFORMS}


def _example() -> tuple[tuple, dict]:
    m, n, k = 8192, 4096, 4096
    return ((jax.ShapeDtypeStruct((m, k // 2), jnp.uint8), jax.ShapeDtypeStruct((n, k // 2), jnp.uint8),
             jax.ShapeDtypeStruct(ref.padded_scale_shape(m, k // 32), jnp.uint8),
             jax.ShapeDtypeStruct(ref.padded_scale_shape(n, k // 32), jnp.uint8)), {})


# --- implementations ----------------------------------------------------------------------------------------

_backend.define_op("gemm_fp4", example=_example, implementations=(
    _backend.Implementation("aiter", aiter_impl.gemm_fp4, platforms=("rocm",), library=AITER_LIBRARY,
                            targets=(GEMM_FP4,), supports=aiter_impl.supports),
    _backend.Implementation("native", native_impl.gemm_fp4, platforms=("cuda", "rocm"), library=native.LIBRARY,
                            targets=(native_impl.DEQUANTIZE_TARGET,)),
    _backend.Implementation("xla", jax.jit(ref.gemm_fp4, static_argnames="b_layout")),
))


def _example_bf16_a() -> tuple[tuple, dict]:
    m, n, k = 8192, 4096, 4096
    return ((jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((n, k // 2), jnp.uint8),
             jax.ShapeDtypeStruct((n, k // 32), jnp.uint8)), {"b_layout": "plain"})


_backend.define_op("gemm_bf16_fp4", example=_example_bf16_a, implementations=(
    _backend.Implementation("native", native_impl.gemm_bf16_fp4, platforms=("cuda", "rocm"), library=native.LIBRARY,
                            targets=(native_impl.DEQUANTIZE_TARGET,)),
    _backend.Implementation("xla", jax.jit(ref.gemm_bf16_fp4, static_argnames="b_layout")),
))
