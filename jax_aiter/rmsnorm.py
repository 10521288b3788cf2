"""RMSNorm, alone and with the residual add fused in front.

``rms_norm(x, gamma)``: ``y = x * rsqrt(mean(x**2, -1) + epsilon) * gamma`` in float32, returned in x's dtype;
exact (to float32 rounding) for every finite input, also where the float32 sum of squares overflows (rows with
elements around 2^64 / sqrt(H) and beyond: the ``native`` and ``xla`` implementations sum those rows scaled; see
jax_aiter/ref/rmsnorm.py). The ``aiter`` implementation cannot, so it takes float16 calls only unless forced.
``rms_norm_with_add(x, residual, gamma)``: ``s = x + residual`` rounded once to x's dtype, returns
``(rms_norm(s, gamma), s)`` — the pre-norm transformer block's residual stream and its normalized copy.

Rematerialization: the native implementation's residuals carry checkpoint names (:data:`CHECKPOINT_NAMES`):
``"rms_norm_rms"`` (``rms`` per row, 4 bytes a row) and ``"rms_norm_sum"`` (``rms_norm_with_add``'s sum).
``jax.checkpoint(f, policy=jax.checkpoint_policies.save_only_these_names(*CHECKPOINT_NAMES))`` then keeps the
forward kernel out of the recomputed backward pass, as long as the norm's output itself is not needed there. The
``aiter`` implementation saves its inputs, and the ``xla`` reference's residuals are JAX autodiff's own (unnamed);
docs/mxfp4.md, "Rematerialization".

Implementations, declared at the end of this module: ``aiter`` (ROCm, AITER's forward kernels; by default for
float16 only, whose squares cannot overflow AITER's float32 sum, and for any dtype when forced),
``native`` (this project's kernels, forward and backward, when gamma has x's dtype) and ``xla``
(``jax_aiter.ref.rmsnorm``, with the derivative it writes out).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_aiter import _backend, _checks, native
from jax_aiter._autodiff import reverse_mode
from jax_aiter.aiter import ADD_RMS_NORM_FWD, RMS_NORM_FWD
from jax_aiter.aiter import LIBRARY as AITER_LIBRARY
from jax_aiter.aiter import rmsnorm as aiter_impl
from jax_aiter.native import rmsnorm as native_impl
from jax_aiter.ref import rmsnorm as ref

__all__ = ["CHECKPOINT_NAMES", "RMS_NAME", "SUM_NAME", "rms_norm", "rms_norm_with_add"]

RMS_NAME = native_impl.RMS_NAME
SUM_NAME = native_impl.SUM_NAME
CHECKPOINT_NAMES = (RMS_NAME, SUM_NAME)


def rms_norm(x: jax.Array, gamma: jax.Array, epsilon: float = 1e-6) -> jax.Array:
    epsilon = _check(x, gamma, epsilon)
    return _backend.dispatch("rms_norm", x, gamma, epsilon=epsilon)


def rms_norm_with_add(x: jax.Array, residual: jax.Array, gamma: jax.Array,
                      epsilon: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    epsilon = _check(x, gamma, epsilon)
    _checks.shape_dtype("residual", residual)
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    _checks.check_same_dtype("residual", residual, "x", x)
    return _backend.dispatch("rms_norm_with_add", x, residual, gamma, epsilon=epsilon)


def _check(x, gamma, epsilon) -> float:
    _checks.check_dtype("x", x, _checks.FLOAT_ACTIVATION_DTYPES)
    _checks.check_dtype("gamma", gamma, _checks.FLOAT_ACTIVATION_DTYPES)
    shape = _checks.check_min_rank("x", x, 1)
    _checks.check_rank("gamma", gamma, 1)
    if gamma.shape[0] != shape[-1]:
        raise ValueError(f"gamma must have x's last dimension {shape[-1]}, got shape {tuple(gamma.shape)}")
    return _checks.check_epsilon("epsilon", epsilon)


# --- implementations ----------------------------------------------------------------------------------------

def _example():
    return (jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16), jax.ShapeDtypeStruct((4096,), jnp.bfloat16)), \
        {"epsilon": 1e-6}


def _example_with_add():
    x = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
    return (x, x, jax.ShapeDtypeStruct((4096,), jnp.bfloat16)), {"epsilon": 1e-6}


# The CPU kernels run on one thread; XLA's code measured faster on two cores. They run when forced, which is how
# the tests and the installed-package checks run them.
_CPU_SLOWER = {"cpu": "XLA's CPU code measured faster than the single-threaded C++ kernels (forward 1.2-1.3x, "
                      "with the add 1.3-1.4x, at 4096 x 4096 bf16 on two cores)"}

_backend.define_op("rms_norm", example=_example, implementations=(
    _backend.Implementation("aiter", aiter_impl.rms_norm, platforms=("rocm",), library=AITER_LIBRARY,
                            targets=(RMS_NORM_FWD,), supports=aiter_impl.supports,
                            forced_only=aiter_impl.forced_only),
    _backend.Implementation("native", native_impl.rms_norm, library=native.LIBRARY,
                            targets=native_impl.RMS_NORM_TARGETS, supports=native_impl.supports,
                            forced_only_on=_CPU_SLOWER),
    _backend.Implementation("xla", reverse_mode(ref.rms_norm)),
))
_backend.define_op("rms_norm_with_add", example=_example_with_add, implementations=(
    _backend.Implementation("aiter", aiter_impl.rms_norm_with_add, platforms=("rocm",), library=AITER_LIBRARY,
                            targets=(ADD_RMS_NORM_FWD,), supports=aiter_impl.supports,
                            forced_only=aiter_impl.forced_only),
    _backend.Implementation("native", native_impl.rms_norm_with_add, library=native.LIBRARY,
                            targets=native_impl.RMS_NORM_WITH_ADD_TARGETS, supports=native_impl.supports,
                            forced_only_on=_CPU_SLOWER),
    _backend.Implementation("xla", reverse_mode(ref.rms_norm_with_add)),
))
