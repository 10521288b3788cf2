"""Object API: ``Mxfp4Tensor`` (one quantized copy, a pytree), ``MXFP4Quantizer`` (how to make the copies of one
tensor role), ``Mxfp4Weight`` (a training weight with its copies made ahead of the linears, a pytree) and
``WeightWorkspace`` (a cache of quantized weights, by name or by weight object)."""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter import _checks
from jax_aiter.gemm_fp4 import _quantize
from jax_aiter.gemm_fp4.recipe import Mxfp4Recipe
from jax_aiter.ref import mxfp4 as ref

__all__ = ["MXFP4Quantizer", "Mxfp4Copies", "Mxfp4Tensor", "Mxfp4Weight", "WeightWorkspace"]


@dataclasses.dataclass(frozen=True, eq=False)
class Mxfp4Tensor:
    """One MXFP4 copy of a tensor of logical ``shape`` [..., K], flattened to the 2-D [M, K].

    ``axis=-1``: rowwise, blocks along K, ``data`` [M, K/2], ``scales`` [M, K/32]. ``axis=0``: columnwise, the
    rowwise copy of the transpose, ``data`` [K, M/2], ``scales`` [K, M/32]. ``data_shuffled`` /
    ``scales_shuffled`` say whether the AITER shuffles were applied (shuffled scales are zero-padded).
    ``hadamard`` is the rotation size applied before quantizing (0 for none) and ``hadamard_key`` the
    uint32[2] sign key, or None for plain Hadamard. Arrays are pytree children; the rest is static.
    """

    data: jax.Array
    scales: jax.Array
    hadamard_key: jax.Array | None
    shape: tuple[int, ...]
    axis: int
    data_shuffled: bool
    scales_shuffled: bool
    hadamard: int

    @property
    def view_shape(self) -> tuple[int, int]:
        """[rows, quantization-axis length] of the matrix that was quantized rowwise."""
        m, k = math.prod(self.shape[:-1]), self.shape[-1]
        return (k, m) if self.axis == 0 else (m, k)

    def dequantize(self, dtype: Any = jnp.float32) -> jax.Array:
        """The logical tensor (shape ``self.shape``): unshuffled, dequantized, un-rotated, transposed back."""
        return _dequantize_tensor(self, dtype=np.dtype(dtype))


jax.tree_util.register_dataclass(Mxfp4Tensor, data_fields=["data", "scales", "hadamard_key"],
                                 meta_fields=["shape", "axis", "data_shuffled", "scales_shuffled", "hadamard"])


@functools.partial(jax.jit, static_argnames="dtype")
def _dequantize_tensor(tensor: Mxfp4Tensor, dtype: np.dtype) -> jax.Array:
    rows, cols = tensor.view_shape
    data = ref.unshuffle_fp4(tensor.data) if tensor.data_shuffled else tensor.data
    scales = tensor.scales
    if tensor.scales_shuffled:
        scales = ref.unshuffle_scales(scales, (rows, cols // ref.BLOCK))
    values = ref.dequantize(data, scales)
    if tensor.hadamard:
        signs = None
        if tensor.hadamard_key is not None:
            signs = ref.hadamard_signs(tensor.hadamard_key, jax.lax.iota(jnp.uint32, cols))
        values = ref.hadamard_unrotate(values, tensor.hadamard, signs)
    if tensor.axis == 0:
        values = values.T
    return values.reshape(tensor.shape).astype(dtype)


class Mxfp4Copies(NamedTuple):
    """The copies a quantizer made of one tensor; a copy it was not asked for is None."""

    rowwise: Mxfp4Tensor | None
    columnwise: Mxfp4Tensor | None


# For each role: (GEMM, AITER operand layout) of its rowwise and of its columnwise copy. AITER's GEMM takes A
# with plain data and B with shuffled data, both with shuffled scales; fprop = x.W^T, dgrad = g.(W^T)^T,
# wgrad = g^T.(x^T)^T.
_ROLE_COPIES = {
    "activation": (("fprop", "gemm_a"), ("wgrad", "gemm_b")),
    "weight": (("fprop", "gemm_b"), ("dgrad", "gemm_b")),
    "gradient": (("dgrad", "gemm_a"), ("wgrad", "gemm_a")),
}


@dataclasses.dataclass(frozen=True)
class MXFP4Quantizer:
    """How to quantize one tensor: which copies (a layout per direction, None for none), the scale rule,
    stochastic rounding, the Hadamard size per copy and the Hadamard sign seed. Static and hashable.

    ``tile_scaling``: the tensor (flattened to 2-D) is first quantized with one scale per 32 x 32 tile
    (``jax_aiter.ref.mxfp4.quantize_tiles``, rounding as ``stochastic`` says); every copy then holds exactly
    those values. It needs both copies unrotated and the flattened rows a multiple of 32."""

    rowwise_layout: str | None = "plain"
    columnwise_layout: str | None = None
    scale_rule: str = "even"
    stochastic: bool = False
    rowwise_hadamard: int = 0
    columnwise_hadamard: int = 0
    hadamard_seed: int | None = None
    tile_scaling: bool = False

    def __post_init__(self) -> None:
        for name in ("rowwise_layout", "columnwise_layout"):
            layout = getattr(self, name)
            if layout is not None:
                _quantize.check_choice(name, layout, ref.LAYOUTS)
        if self.rowwise_layout is None and self.columnwise_layout is None:
            raise ValueError("rowwise_layout and columnwise_layout are both None: the quantizer would make no copy")
        _quantize.check_choice("scale_rule", self.scale_rule, ref.SCALE_RULES)
        if not isinstance(self.stochastic, bool):
            raise TypeError(f"stochastic must be a bool, got {type(self.stochastic).__name__}")
        _quantize.check_hadamard_size("rowwise_hadamard", self.rowwise_hadamard)
        _quantize.check_hadamard_size("columnwise_hadamard", self.columnwise_hadamard)
        _quantize.check_seed("hadamard_seed", self.hadamard_seed)
        if not isinstance(self.tile_scaling, bool):
            raise TypeError(f"tile_scaling must be a bool, got {type(self.tile_scaling).__name__}")
        if self.tile_scaling and (self.rowwise_hadamard or self.columnwise_hadamard):
            raise ValueError("tile_scaling needs rowwise_hadamard = columnwise_hadamard = 0 (a rotation along one "
                             "axis breaks the 32 x 32 tiles)")

    @classmethod
    def for_role(cls, role: str, recipe: Mxfp4Recipe | None = None) -> MXFP4Quantizer:
        """Both copies of ``role`` as ``recipe`` (default: ``Mxfp4Recipe.default()``) and the GEMMs they feed
        require."""
        recipe = Mxfp4Recipe.default() if recipe is None else recipe
        if not isinstance(recipe, Mxfp4Recipe):
            raise TypeError(f"recipe must be an Mxfp4Recipe, got {type(recipe).__name__}")
        if role not in _ROLE_COPIES:
            raise ValueError(f"role must be one of {tuple(_ROLE_COPIES)}, got {role!r}")
        (row_gemm, row_layout), (col_gemm, col_layout) = _ROLE_COPIES[role]
        return cls(rowwise_layout=row_layout, columnwise_layout=col_layout, scale_rule=recipe.scale_rule(role),
                   stochastic=recipe.stochastic(role), rowwise_hadamard=recipe.hadamard(row_gemm),
                   columnwise_hadamard=recipe.hadamard(col_gemm), hadamard_seed=recipe.hadamard_seed,
                   tile_scaling=role == "weight" and recipe.weight_tile_scaling)

    @classmethod
    def for_activation(cls, recipe: Mxfp4Recipe | None = None) -> MXFP4Quantizer:
        """x: rowwise as fprop's A operand, columnwise as wgrad's B operand."""
        return cls.for_role("activation", recipe)

    @classmethod
    def for_weight(cls, recipe: Mxfp4Recipe | None = None) -> MXFP4Quantizer:
        """W: rowwise as fprop's B operand, columnwise as dgrad's B operand."""
        return cls.for_role("weight", recipe)

    @classmethod
    def for_grad(cls, recipe: Mxfp4Recipe | None = None) -> MXFP4Quantizer:
        """g: rowwise as dgrad's A operand, columnwise as wgrad's A operand."""
        return cls.for_role("gradient", recipe)

    def apply_tiles(self, matrix: jax.Array, sr_words: jax.Array | None,
                    index_offset: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """With ``tile_scaling``: the 2-D ``matrix`` quantized per 32 x 32 tile (stochastically with ``sr_words``,
        at global indices from ``index_offset``) and None for the casts' SR words, since the tile values are on
        every copy's grid already and the casts round nothing. Without it: both unchanged."""
        if not self.tile_scaling:
            return matrix, sr_words
        return ref.quantize_tiles(matrix, scale_rule=self.scale_rule, sr_key=sr_words, index_offset=index_offset), None

    def quantize(self, x: jax.Array, *, sr_key: Any = None) -> Mxfp4Copies:
        """The requested copies of ``x`` [..., K] (leading axes flattened; columnwise blocks run along them).
        Two copies come from one dual cast. ``sr_key`` is required exactly when ``stochastic`` is set."""
        _checks.check_dtype("x", x, _quantize.INPUT_DTYPES)
        shape = _checks.check_min_rank("x", x, 1)
        if self.stochastic and sr_key is None:
            raise ValueError("sr_key: this quantizer uses stochastic rounding and needs a key")
        if not self.stochastic and sr_key is not None:
            raise ValueError("sr_key was given, but this quantizer rounds to nearest (stochastic=False)")
        matrix = jnp.reshape(x, (-1, shape[-1]))
        if self.tile_scaling:
            if matrix.shape[0] % ref.BLOCK or matrix.shape[1] % ref.BLOCK:
                raise ValueError(f"x: tile_scaling needs the flattened [{matrix.shape[0]}, {matrix.shape[1]}] to "
                                 "have both axes multiples of 32")
            matrix, sr_key = self.apply_tiles(matrix, None if sr_key is None else _quantize.key_words(sr_key, "sr_key"))
        sizes = (self.rowwise_hadamard if self.rowwise_layout else 0,
                 self.columnwise_hadamard if self.columnwise_layout else 0)
        signed = self.hadamard_seed is not None and any(sizes)
        hadamard_key = self.hadamard_seed if signed else None
        sign_words = _quantize.key_words(self.hadamard_seed, "hadamard_seed") if signed else None
        common = dict(scale_rule=self.scale_rule, sr_key=sr_key, hadamard_key=hadamard_key)
        if self.rowwise_layout and self.columnwise_layout:
            row, col = _quantize.cast_mxfp4_dual(
                matrix, hadamard_rowwise=sizes[0], hadamard_columnwise=sizes[1], layout_rowwise=self.rowwise_layout,
                layout_columnwise=self.columnwise_layout, **common)
        elif self.rowwise_layout:
            row, col = _quantize.cast_mxfp4(matrix, hadamard=sizes[0], layout=self.rowwise_layout, **common), None
        else:
            row, col = None, _quantize.cast_mxfp4(matrix, columnwise=True, hadamard=sizes[1],
                                                  layout=self.columnwise_layout, **common)

        def tensor(copy, axis, layout, size):
            if copy is None:
                return None
            return Mxfp4Tensor(copy[0], copy[1], sign_words if size else None, shape, axis,
                               data_shuffled=layout == "gemm_b", scales_shuffled=layout != "plain", hadamard=size)

        return Mxfp4Copies(tensor(row, -1, self.rowwise_layout, sizes[0]),
                           tensor(col, 0, self.columnwise_layout, sizes[1]))


@dataclasses.dataclass(frozen=True, eq=False)
class Mxfp4Weight:
    """A weight ``[N, K]`` with both MXFP4 copies its linear layer needs, made once by
    ``jax_aiter.gemm_fp4.quantize_weights`` and passed to ``gemm_fp4_bf16`` as ``b``.

    ``weight`` is the weight itself: the GEMMs never read it, it is the slot gradients arrive in (``gemm_fp4_bf16``
    returns dgrad-and-wgrad's dW as its cotangent, and ``quantize_weights`` passes it on to the weight it was
    given). ``row_data`` [N, K/2] / ``row_scales`` [N, K/32] are the rowwise copy (fprop's B operand) and
    ``col_data`` [K, N/2] / ``col_scales`` [K, N/32] the columnwise one (dgrad's B operand), both in the plain
    layout, quantized as ``recipe``'s weight role says. Arrays are pytree children; ``recipe`` is static.
    """

    weight: jax.Array
    row_data: jax.Array
    row_scales: jax.Array
    col_data: jax.Array
    col_scales: jax.Array
    recipe: Mxfp4Recipe

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)


jax.tree_util.register_dataclass(Mxfp4Weight, data_fields=["weight", "row_data", "row_scales", "col_data",
                                                            "col_scales"], meta_fields=["recipe"])


@dataclasses.dataclass
class _Entry:
    source: weakref.ref
    quantizer: MXFP4Quantizer
    sr_words: np.ndarray | None
    copies: Mxfp4Copies


@dataclasses.dataclass(frozen=True)
class _Identity:
    """The key of an entry made without a ``cache_name``: the weight object's id (checked against the entry's
    weak reference, so a reused id never matches)."""

    object_id: int


class WeightWorkspace:
    """Quantized weights cached by name, or by the weight object itself.

    The rule: an entry is served only for the *same* concrete ``jax.Array`` object (held by weak reference)
    with an equal quantizer and equal stochastic-rounding key. JAX arrays are immutable, so the same object
    always holds the same values, and an optimizer step makes a new object, which requantizes. Traced weights
    (inside ``jit``, ``grad``, ...) and non-JAX arrays are quantized on every call and never stored: a trace
    cannot tell two steps' values apart, and XLA merges repeated quantizations of one weight inside a program.

    Entries are keyed by ``cache_name`` when one is given, else by the weight object (one entry per array). An
    entry is dropped when its weight is garbage-collected. ``name in ws`` / ``array in ws`` ask whether a live
    entry exists for that name / that very array; :meth:`keys` lists the names; :meth:`evict` drops one entry and
    :meth:`clear` all.
    """

    def __init__(self) -> None:
        self._entries: dict[str | _Identity, _Entry] = {}

    def __len__(self) -> int:
        return sum(1 for entry in self._entries.values() if entry.source() is not None)

    def __contains__(self, key: Any) -> bool:
        if isinstance(key, str):
            entry = self._entries.get(key)
            return entry is not None and entry.source() is not None
        return isinstance(key, jax.Array) and any(entry.source() is key for entry in self._entries.values())

    def keys(self) -> list[str]:
        """The cache names of the live named entries (entries keyed by their weight object have none)."""
        return [key for key, entry in self._entries.items() if isinstance(key, str) and entry.source() is not None]

    def evict(self, key: str | jax.Array) -> bool:
        """Drop the entry named ``key`` (a str), or every entry made from the array ``key``. Returns whether an
        entry was dropped; evicting a missing name is not an error."""
        if isinstance(key, str):
            return self._entries.pop(key, None) is not None
        if not isinstance(key, jax.Array):
            raise TypeError(f"key must be a cache name (str) or a jax.Array, got {type(key).__name__}")
        found = [name for name, entry in self._entries.items() if entry.source() is key]
        for name in found:
            del self._entries[name]
        return bool(found)

    def clear(self) -> None:
        self._entries.clear()

    def get_or_quantize(self, w: jax.Array, quantizer: MXFP4Quantizer, *, cache_name: str | None = None,
                        sr_key: Any = None, force_update: bool = False) -> Mxfp4Copies:
        """``quantizer.quantize(w, sr_key=sr_key)``, served from the cache when the entry under ``cache_name``
        (default: the entry of this array object) was made from this very array with an equal quantizer and SR
        key. ``force_update=True`` quantizes anew and replaces the entry."""
        if not isinstance(quantizer, MXFP4Quantizer):
            raise TypeError(f"quantizer must be an MXFP4Quantizer, got {type(quantizer).__name__}")
        if cache_name is not None and not isinstance(cache_name, str):
            raise TypeError(f"cache_name must be a str or None, got {type(cache_name).__name__}")
        if not isinstance(force_update, bool):
            raise TypeError(f"force_update must be a bool, got {type(force_update).__name__}")
        if not _is_concrete(w) or (sr_key is not None and not isinstance(sr_key, int) and not _is_concrete(sr_key)):
            return quantizer.quantize(w, sr_key=sr_key)
        sr_words = None if sr_key is None else np.asarray(_quantize.key_words(sr_key, "sr_key"))
        key = _Identity(id(w)) if cache_name is None else cache_name
        entry = self._entries.get(key)
        if (not force_update and entry is not None and entry.source() is w and entry.quantizer == quantizer
                and _same_words(entry.sr_words, sr_words)):
            return entry.copies
        copies = quantizer.quantize(w, sr_key=sr_key)
        self._entries[key] = _Entry(weakref.ref(w, _dropper(self, key)), quantizer, sr_words, copies)
        return copies


def _dropper(workspace: WeightWorkspace, key: str | _Identity):
    """A weak-reference callback that removes ``key``'s entry when its weight is collected (and the entry was
    not replaced meanwhile). It holds the workspace weakly: a workspace never lives on through its weights."""
    owner = weakref.ref(workspace)

    def drop(source: weakref.ref) -> None:
        ws = owner()
        if ws is not None and (entry := ws._entries.get(key)) is not None and entry.source is source:
            del ws._entries[key]

    return drop


def _is_concrete(value: Any) -> bool:
    return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)


def _same_words(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))
