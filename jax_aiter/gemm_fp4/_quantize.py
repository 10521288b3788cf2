"""MXFP4 casts: the dispatched ops ``cast_mxfp4`` / ``cast_mxfp4_dual`` and the functional API built on them.

The public functions check every argument (naming it) before anything is traced, turn keys into the kernels'
uint32[2] words, and call :func:`jax_aiter._backend.dispatch`; the ``xla`` implementation is
``jax_aiter.ref.mxfp4``; the ``native`` one is this project's CPU/CUDA/HIP kernels (``jax_aiter.native.mxfp4``),
under the same op signature (docs/mxfp4.md, "Kernel contract"). Both are declared at the end of this module.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _backend, _checks, native
from jax_aiter.native import mxfp4 as native_impl
from jax_aiter.ref import mxfp4 as ref

__all__ = ["cast_mxfp4", "cast_mxfp4_dual", "dequantize_mxfp4", "key_words", "quantize_mxfp4"]

INPUT_DTYPES = _checks.FLOAT_ACTIVATION_DTYPES
OUTPUT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
_NO_KEY = np.zeros(2, np.uint32)  # passed where a key is switched off, so the op signature never varies


def key_words(key: Any, name: str) -> jax.Array:
    """The uint32[2] words a kernel hashes with, from an int seed (low word, high word), a typed
    ``jax.random.key`` (its ``jax.random.bits``) or a uint32[2] array (used as is)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        seed = int(key)
        if not 0 <= seed < 2 ** 64:
            raise ValueError(f"{name} as an integer seed must be in [0, 2**64), got {seed}")
        return jnp.array([seed & 0xFFFFFFFF, seed >> 32], jnp.uint32)
    if not hasattr(key, "dtype") or not hasattr(key, "shape"):
        raise TypeError(f"{name} must be an int seed, a jax.random key or a uint32[2] array, "
                        f"got {type(key).__name__}")
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if tuple(key.shape) != ():
            raise ValueError(f"{name} must be a single PRNG key, got a key array of shape {tuple(key.shape)}")
        return jax.random.bits(key, (2,), jnp.uint32)
    if np.dtype(key.dtype) != np.uint32 or tuple(key.shape) != (2,):
        raise TypeError(f"{name} as an array must be uint32[2], got {np.dtype(key.dtype)}{list(key.shape)}")
    return jnp.asarray(key)


def check_choice(name: str, value: Any, allowed: tuple) -> Any:
    if isinstance(value, bool) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_hadamard_size(name: str, value: Any) -> int:
    """0 (no rotation), 16 or 32, as an int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int (0, 16 or 32), got {type(value).__name__}")
    return check_choice(name, int(value), ref.HADAMARD_SIZES)


def check_hadamard(name: str, value: Any) -> int:
    """Like :func:`check_hadamard_size`, with None meaning no rotation."""
    return 0 if value is None else check_hadamard_size(name, value)


def check_seed(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 64):
        raise ValueError(f"{name} must be None or an int in [0, 2**64), got {value!r}")


def check_quantizable(name: str, shape: tuple[int, ...], columnwise: bool, layout: str) -> None:
    """The quantized view (x, or x^T for a columnwise copy) must have whole blocks, and the shuffled data
    layout needs 16-row by 64-element tiles."""
    rows, cols = (shape[1], shape[0]) if columnwise else shape
    axis = "axis 0 (columnwise copy)" if columnwise else "axis 1"
    if cols % ref.BLOCK:
        raise ValueError(f"{name}: the quantization axis, {axis}, has length {cols}; it must be a multiple of 32")
    if layout == "gemm_b" and (rows % 16 or cols % 64):
        raise ValueError(f"{name}: layout 'gemm_b' needs the quantized view [{rows}, {cols}] to have rows % 16 == 0 "
                         "and a quantization axis % 64 == 0 (AITER's shuffled data tiles)")


def _hadamard_words(hadamard_key: Any, sizes: tuple[int, ...]) -> jax.Array:
    if hadamard_key is None:
        return jnp.asarray(_NO_KEY)
    if not any(sizes):
        raise ValueError("hadamard_key gives Hadamard signs, but no Hadamard rotation (16 or 32) is requested")
    return key_words(hadamard_key, "hadamard_key")


def _sr_words(sr_key: Any) -> jax.Array:
    return jnp.asarray(_NO_KEY) if sr_key is None else key_words(sr_key, "sr_key")


def _offset_words(index_offset: Any, quantized_axes: tuple[int, ...]) -> jax.Array:
    """uint32 (row, column) of x[0, 0] in the logical input; an offset along an axis that is quantized must be
    a multiple of 32 so that the tile's blocks are the logical input's blocks (checked when it is concrete)."""
    if index_offset is None:
        return jnp.asarray(_NO_KEY)
    shape, dtype = _checks.shape_dtype("index_offset", index_offset)
    if dtype != np.uint32 or shape != (2,):
        raise TypeError(f"index_offset must be a uint32[2] array (row, column), got {dtype}{list(shape)}")
    if not isinstance(index_offset, jax.core.Tracer):
        concrete = np.asarray(index_offset)
        for axis in quantized_axes:
            if concrete[axis] % ref.BLOCK:
                raise ValueError(f"index_offset[{axis}] = {concrete[axis]} is along a quantized axis and must be a "
                                 "multiple of 32")
    return jnp.asarray(index_offset)


def cast_mxfp4(x: jax.Array, *, columnwise: bool = False, scale_rule: str = "even", sr_key: Any = None,
               hadamard: int | None = 0, hadamard_key: Any = None, layout: str = "plain", index_offset: Any = None
               ) -> tuple[jax.Array, jax.Array]:
    """One MXFP4 copy of a 2-D tensor ``x`` [M, K] (bf16, fp16 or fp32).

    Rowwise (default): blocks of 32 along K, data uint8 [M, K/2], scales uint8 [M, K/32]. ``columnwise=True``:
    the rowwise copy of x^T, data [K, M/2], scales [K, M/32]. ``sr_key`` (int seed, typed key or uint32[2])
    switches on stochastic rounding; ``hadamard`` (16 or 32) rotates each chunk of the quantization axis first,
    with keyed random signs when ``hadamard_key`` is given. ``layout``: "plain", "gemm_a" (scales shuffled and
    zero-padded, AITER's A operand), "gemm_b" (data and scales shuffled, AITER's B operand) or "values": the
    copy's exact values as bf16 data [M, K] (or [K, M]), i.e. :func:`dequantize_mxfp4` of its plain bytes, with
    plain scales, written by the cast itself (the A operand of :func:`gemm_bf16_fp4`).
    ``index_offset`` (uint32[2], default zeros): the global (row, column) of x[0, 0] when x is a tile or shard of
    a larger logical input, so that hashed rounding and signs match the unsplit cast.
    """
    _checks.check_dtype("x", x, INPUT_DTYPES)
    shape = _checks.check_rank("x", x, 2)
    if not isinstance(columnwise, bool):
        raise TypeError(f"columnwise must be a bool, got {type(columnwise).__name__}")
    check_choice("scale_rule", scale_rule, ref.SCALE_RULES)
    check_choice("layout", layout, ref.CAST_LAYOUTS)
    hadamard = check_hadamard("hadamard", hadamard)
    check_quantizable("x", shape, columnwise, layout)
    hadamard_words = _hadamard_words(hadamard_key, (hadamard,))
    offset = _offset_words(index_offset, (0,) if columnwise else (1,))
    data, scales = _backend.dispatch("cast_mxfp4", x, _sr_words(sr_key), hadamard_words, offset,
                                     columnwise=columnwise, scale_rule=scale_rule, stochastic=sr_key is not None,
                                     hadamard=hadamard, hadamard_signs=hadamard_key is not None, layout=layout)
    return data, scales


def cast_mxfp4_dual(x: jax.Array, *, scale_rule: str = "even", sr_key: Any = None, hadamard_rowwise: int | None = 0,
                    hadamard_columnwise: int | None = 0, hadamard_key: Any = None, layout_rowwise: str = "plain",
                    layout_columnwise: str = "plain", index_offset: Any = None
                    ) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    """Rowwise and columnwise copies of ``x`` [M, K] in one call: ``((row_data, row_scales), (col_data,
    col_scales))``, each exactly what :func:`cast_mxfp4` gives for that direction with the same arguments.

    The copies share the scale rule, the stochastic-rounding key (the columnwise copy hashes a separate
    stream, so the two round independently) and the Hadamard sign key; Hadamard size and layout are per copy,
    because each copy feeds a different GEMM.
    """
    _checks.check_dtype("x", x, INPUT_DTYPES)
    shape = _checks.check_rank("x", x, 2)
    check_choice("scale_rule", scale_rule, ref.SCALE_RULES)
    check_choice("layout_rowwise", layout_rowwise, ref.CAST_LAYOUTS)
    check_choice("layout_columnwise", layout_columnwise, ref.CAST_LAYOUTS)
    hadamard_rowwise = check_hadamard("hadamard_rowwise", hadamard_rowwise)
    hadamard_columnwise = check_hadamard("hadamard_columnwise", hadamard_columnwise)
    check_quantizable("x", shape, False, layout_rowwise)
    check_quantizable("x", shape, True, layout_columnwise)
    hadamard_words = _hadamard_words(hadamard_key, (hadamard_rowwise, hadamard_columnwise))
    row_data, row_scales, col_data, col_scales = _backend.dispatch(
        "cast_mxfp4_dual", x, _sr_words(sr_key), hadamard_words, _offset_words(index_offset, (0, 1)),
        scale_rule=scale_rule, stochastic=sr_key is not None, hadamard_rowwise=hadamard_rowwise,
        hadamard_columnwise=hadamard_columnwise, hadamard_signs=hadamard_key is not None,
        layout_rowwise=layout_rowwise, layout_columnwise=layout_columnwise)
    return (row_data, row_scales), (col_data, col_scales)


def quantize_mxfp4(x: jax.Array, *, scale_rule: str = "even", hadamard: int | None = None, hadamard_key: Any = None,
                   sr_key: Any = None) -> tuple[jax.Array, jax.Array]:
    """Rowwise MXFP4 along the last axis of ``x`` [..., K] (K % 32 == 0): ``(data, scales)``, plain layout,
    data uint8 [..., K/2] (two E2M1 codes per byte, even element in the low nibble), scales uint8 [..., K/32]
    (E8M0 bytes). The leading axes are flattened into the rows of one logical 2-D input, whose (row, column)
    indices feed stochastic rounding."""
    _checks.check_dtype("x", x, INPUT_DTYPES)
    shape = _checks.check_min_rank("x", x, 1)
    if shape[-1] % ref.BLOCK:
        raise ValueError(f"x: the last axis has length {shape[-1]}; it must be a multiple of 32")
    data, scales = cast_mxfp4(jnp.reshape(x, (-1, shape[-1])), scale_rule=scale_rule, sr_key=sr_key,
                              hadamard=hadamard, hadamard_key=hadamard_key)
    return (data.reshape(*shape[:-1], shape[-1] // 2), scales.reshape(*shape[:-1], shape[-1] // ref.BLOCK))


_dequantize = jax.jit(ref.dequantize, static_argnames="dtype")


def dequantize_mxfp4(data: jax.Array, scales: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """Values of plain-layout MXFP4 ``data`` [..., K/2] with ``scales`` [..., K/32]: exact in float32 (a 0xFF
    scale gives NaN for its block), then converted to ``dtype`` (float32, bfloat16 or float16)."""
    _checks.check_dtype("data", data, (jnp.uint8,))
    _checks.check_dtype("scales", scales, (jnp.uint8,))
    shape = _checks.check_min_rank("data", data, 1)
    if shape[-1] % 16:
        raise ValueError(f"data: the last axis holds K/2 bytes for K a multiple of 32; got {shape[-1]}")
    expected = shape[:-1] + (shape[-1] * 2 // ref.BLOCK,)
    if tuple(scales.shape) != expected:
        raise ValueError(f"scales must have shape {expected} for data of shape {shape}, got {tuple(scales.shape)}")
    try:
        dtype = np.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"dtype must be a dtype, got {dtype!r}") from err
    if dtype not in tuple(np.dtype(d) for d in OUTPUT_DTYPES):
        raise TypeError(f"dtype must be one of float32, bfloat16, float16, got {dtype}")
    return _dequantize(data, scales, dtype=dtype)


_CAST_PARAMS = ("columnwise", "scale_rule", "stochastic", "hadamard", "hadamard_signs", "layout")
_DUAL_PARAMS = ("scale_rule", "stochastic", "hadamard_rowwise", "hadamard_columnwise", "hadamard_signs",
                "layout_rowwise", "layout_columnwise")


def _example_cast() -> tuple[tuple, dict]:
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    args = (jax.ShapeDtypeStruct((8192, 4096), jnp.bfloat16), key, key, key)
    return args, dict(columnwise=False, scale_rule="even", stochastic=False, hadamard=0, hadamard_signs=False,
                      layout="gemm_a")


def _example_dual() -> tuple[tuple, dict]:
    args, _ = _example_cast()
    return args, dict(scale_rule="even", stochastic=False, hadamard_rowwise=0, hadamard_columnwise=16,
                      hadamard_signs=False, layout_rowwise="gemm_a", layout_columnwise="gemm_b")


# --- implementations ----------------------------------------------------------------------------------------

# On the CPU the default is XLA's code (the same bytes); the C++ kernels run when forced.
_CPU_SLOWER = {"cpu": "XLA's CPU code measured faster than the single-threaded C++ kernel (rowwise 2.4x, dual "
                      "1.3-1.8x at 4096 x 4096 bf16 on two cores)"}
_backend.define_op("cast_mxfp4", example=_example_cast, implementations=(
    _backend.Implementation("native", native_impl.cast_mxfp4, library=native.LIBRARY, targets=(native_impl.TARGET,),
                            forced_only_on=_CPU_SLOWER),
    _backend.Implementation("xla", jax.jit(ref.cast_mxfp4, static_argnames=_CAST_PARAMS)),
))
_backend.define_op("cast_mxfp4_dual", example=_example_dual, implementations=(
    _backend.Implementation("native", native_impl.cast_mxfp4_dual, library=native.LIBRARY,
                            targets=(native_impl.TARGET,), forced_only_on=_CPU_SLOWER),
    _backend.Implementation("xla", jax.jit(ref.cast_mxfp4_dual, static_argnames=_DUAL_PARAMS)),
))
