"""FP8 linear layer ``gemm_fp8(a, b) = a[..., K] @ b[N, K]^T`` with per-tensor current scaling (docs/fp8.md).

Forward: x = a and W = b are each cast to E4M3 with their own scale (this call's amax over the whole tensor,
``jax_aiter.ref.gemm_fp8``; powers of two), multiplied with float32 accumulation, rescaled (exactly) and rounded
once to a's dtype. Backward (``custom_vjp``): the output gradient g is cast to the recipe's gradient format (E5M2 by
default) with its own scale; dgrad ``dx = g . W`` and wgrad ``dW = g^T . x`` multiply it with the forward's
float8 copies of W and x, the residuals (one byte an element). Gradients come back in the dtypes of a and b.

The float8 product is the op ``gemm_fp8``, declared at the end of this module with one implementation, ``xla``:
on the CPU the exact reference (float8 values upcast to float32, dot at HIGHEST precision); on GPUs the form
XLA's GPU compilers rewrite to an FP8 GEMM that applies the (power-of-two) scale and rounds into the output dtype
itself (``jax_aiter.ref.gemm_fp8.scaled_dot_fp8``). Both give the same values up to the order of the float32
sums.

The casts are plain JAX, partitioned by XLA (the amax becomes an all-reduce under sharding). Forward, dgrad and
wgrad are custom-partitioned like ``jax_aiter.gemm`` (``jax_aiter._partition``): the weight's float8 copy is
gathered for fprop and dgrad, and wgrad's float32 partial products are reduced over the token axes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _backend, _checks
from jax_aiter._partition import LinearOp
from jax_aiter.ref import gemm_fp8 as ref

__all__ = ["Fp8Recipe", "gemm_fp8"]


@dataclasses.dataclass(frozen=True)
class Fp8Recipe:
    """Numerics of ``gemm_fp8``, a static, hashable value: current scaling (each operand of each GEMM scaled by
    its own per-tensor amax in this call), x and W in E4M3 (``"float8_e4m3fn"``), and the output gradient in
    ``gradient_format``: ``"float8_e5m2"`` (the default: range for gradients) or ``"float8_e4m3fn"`` (precision).

    The forward format is not a choice: fprop multiplies x and W in one format, and an E5M2 x E5M2 product is not
    an FP8 GEMM cuBLASLt (or gfx950's hipBLASLt) offers.
    """

    gradient_format: str = ref.E5M2

    def __post_init__(self) -> None:
        if not isinstance(self.gradient_format, str) or self.gradient_format not in ref.FORMATS:
            raise ValueError(f"gradient_format must be one of {ref.FORMATS}, got {self.gradient_format!r}")

    @classmethod
    def default(cls) -> Fp8Recipe:
        """E4M3 forward, E5M2 gradients, current scaling."""
        return cls()

    @property
    def forward_format(self) -> str:
        return ref.E4M3


def gemm_fp8(a: jax.Array, b: jax.Array, recipe: Fp8Recipe | None = None) -> jax.Array:
    """``a[..., K] @ b[N, K]^T`` in FP8 as ``recipe`` says (default ``Fp8Recipe.default()``), output in a's dtype.

    ``a`` and ``b`` are bfloat16, float16 or float32, not necessarily the same; any M, N and K. Differentiable in
    reverse mode with respect to both; the gradients come back in the dtypes of ``a`` and ``b``.
    """
    recipe = Fp8Recipe.default() if recipe is None else recipe
    if not isinstance(recipe, Fp8Recipe):
        raise TypeError(f"recipe must be an Fp8Recipe or None, got {type(recipe).__name__}")
    a_dtype = _checks.check_dtype("a", a, _checks.FLOAT_ACTIVATION_DTYPES)
    b_dtype = _checks.check_dtype("b", b, _checks.FLOAT_ACTIVATION_DTYPES)
    a_shape = _checks.check_min_rank("a", a, 1)
    b_shape = _checks.check_rank("b", b, 2)
    if b_shape[1] != a_shape[-1]:
        raise ValueError(f"b must be [N, K] with K = a's last dimension {a_shape[-1]}, got shape {b_shape}")
    return _gemm_fp8(a, b, recipe, (a_dtype, b_dtype))


def _cast(t: jax.Array, fmt: str) -> tuple[jax.Array, jax.Array]:
    scale = ref.current_scale(t, fmt)
    return ref.quantize(t, scale, fmt), scale


def _rows(t: jax.Array) -> jax.Array:
    """A device's block ``[..., C]`` as the 2-D ``[rows, C]`` that XLA's FP8 GEMM rewrite requires."""
    return t.reshape(-1, t.shape[-1])


def _fprop(dtype, split, qx, qw, scale):
    qw = split.gather(qw, n=0, k=1)
    y = _backend.dispatch("gemm_fp8", _rows(qx), qw, scale, contracting=(1, 1), out_dtype=dtype)
    return (y.reshape(*qx.shape[:-1], qw.shape[0]),)


def _dgrad(dtype, split, qg, qw, scale):
    qw = split.gather(qw, n=0, k=1)
    dx = _backend.dispatch("gemm_fp8", _rows(qg), qw, scale, contracting=(1, 0), out_dtype=dtype)
    return (dx.reshape(*qg.shape[:-1], qw.shape[1]),)


def _wgrad(dtype, split, qg, qx, qw, scale):
    # qw contributes only its sharding, which is the one the weight gradient is reduced to.
    del qw
    # Partial products over token shards stay float32 until they are reduced: one rounding to b's dtype.
    partial_dtype = np.dtype(np.float32) if split.splits_tokens() else dtype
    partial = _backend.dispatch("gemm_fp8", _rows(qg), _rows(qx), scale, contracting=(0, 0),
                                out_dtype=partial_dtype)
    return (split.reduce_over_tokens(partial, n=0, k=1).astype(dtype),)


# The scales are float32 scalars, replicated (the empty spec).
_FPROP = LinearOp(_fprop, operands=("... _", "n k", ""), results=("... _",))
_DGRAD = LinearOp(_dgrad, operands=("... _", "n k", ""), results=("... _",))
_WGRAD = LinearOp(_wgrad, operands=("... _", "... _", "n k", ""), results=("n k",))


def _forward(a, b, recipe):
    qx, x_scale = _cast(a, recipe.forward_format)
    qw, w_scale = _cast(b, recipe.forward_format)
    y = _FPROP(np.dtype(a.dtype), qx, qw, x_scale * w_scale)[0]
    return y, (qx, qw, x_scale, w_scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _gemm_fp8(a, b, recipe, dtypes):
    del dtypes
    return _forward(a, b, recipe)[0]


def _fwd(a, b, recipe, dtypes):
    del dtypes
    return _forward(a, b, recipe)


def _bwd(recipe, dtypes, residuals, dy):
    qx, qw, x_scale, w_scale = residuals
    qg, g_scale = _cast(dy, recipe.gradient_format)
    dx = _DGRAD(dtypes[0], qg, qw, g_scale * w_scale)[0]
    dw = _WGRAD(dtypes[1], qg, qx, qw, g_scale * x_scale)[0]
    return dx, dw


_gemm_fp8.defvjp(_fwd, _bwd)

# --- implementations ----------------------------------------------------------------------------------------

NOTES = {"cuda": "XLA's dot of the float8 operands times the scale, rewritten to cuBLASLt's FP8 GEMM with the scale "
                 "and the rounding into the output dtype inside it (Ada, Hopper and later)",
         "rocm": "XLA's dot of the float8 operands times the scale, rewritten to hipBLASLt's FP8 GEMM on GPUs with "
                 "OCP float8 (gfx950); elsewhere XLA's float16 dot of the same values"}


def _example() -> tuple[tuple, dict]:
    m, n, k = 16384, 14336, 4096
    return ((jax.ShapeDtypeStruct((m, k), jnp.float8_e4m3fn), jax.ShapeDtypeStruct((n, k), jnp.float8_e4m3fn),
             jax.ShapeDtypeStruct((), jnp.float32)), {"contracting": (1, 1), "out_dtype": np.dtype(jnp.bfloat16)})


_backend.define_op("gemm_fp8", example=_example, implementations=(
    _backend.Implementation("xla", ref.scaled_dot, variants={
        platform: (ref.scaled_dot_fp8, note) for platform, note in NOTES.items()}),
))
