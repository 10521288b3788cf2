"""Partitioning of the GEMM ops (``gemm``, ``gemm_fp4_bf16``) across devices under FSDP: ``custom_partitioning``
with Shardy sharding rules.

XLA cannot partition an opaque custom call (an AITER kernel, a native MXFP4 cast): it would gather every operand
onto every device. So each op is written as a *local* function of one device's blocks and a :class:`Split`, the
description of how the call is divided. :class:`LinearOp` decides the split from the operands' shardings
(activations divided on their token axes, weights ``[N, K]`` on FSDP mesh axes), and the local function calls the
split's collectives: :meth:`Split.gather` for the weight in fprop and dgrad, :meth:`Split.reduce_over_tokens` for
wgrad. With :data:`UNSPLIT` the same local function is the single-device program, so one source defines the
numerics. Rules, divisibility and byte counts: docs/mxfp4.md, "Sharding".

Operands and results are described by one word per dimension:

* ``m`` (or any other lower-case name but ``n``/``k``), and each leading dimension covered by ``...``: a token
  dimension. Token dimensions keep the sharding they arrive with.
* ``n``, ``k``: the weight's N and K. They keep the weight's sharding; the local function gathers them.
* ``_``: replicated (an activation's feature axis, a key). An empty spec is a scalar, replicated.
* ``name/p``: the same dimension packed, ``p`` logical elements per stored index (fp4 bytes: 2, MXFP4 scales: 32).

A dimension whose sharding does not divide it into whole blocks of the op's multiple for it (32-element
quantization blocks, 64-token wgrad operands) is replicated instead: XLA gathers it before the op, which stays
correct and costs the bytes of the unquantized tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_aiter import _backend

__all__ = ["LinearOp", "Split", "UNSPLIT"]

_WEIGHT_DIMS = ("n", "k")
_REPLICATED = "_"
_LEADING = "..."


@dataclasses.dataclass(frozen=True)
class _Dim:
    name: str
    pack: int = 1  # logical elements per stored index


def _parse(spec: str) -> tuple[_Dim, ...]:
    dims = []
    for word in spec.split():
        name, _, pack = word.partition("/")
        dims.append(_Dim(name, int(pack) if pack else 1))
    return tuple(dims)


def _expand(dims: tuple[_Dim, ...], rank: int) -> tuple[_Dim, ...]:
    """Replace a leading ``...`` with one token dimension per leading axis of an array of ``rank``."""
    if not dims or dims[0].name != _LEADING:
        return dims
    return tuple(_Dim(f"{_LEADING}{i}") for i in range(rank - len(dims) + 1)) + dims[1:]


def _is_token(name: str) -> bool:
    return name != _REPLICATED and name not in _WEIGHT_DIMS


@dataclasses.dataclass(frozen=True)
class Split:
    """How one call is divided: the mesh axes (major first) that split each named dimension, and the mesh's axis
    sizes. Inside a partitioned op the methods emit collectives; for :data:`UNSPLIT` they do nothing."""

    axes: Mapping[str, tuple[str, ...]]
    sizes: Mapping[str, int]

    def splits(self, *names: str) -> bool:
        return any(self.axes.get(name) for name in names)

    def splits_tokens(self) -> bool:
        """Whether a contraction over tokens leaves partial sums on several devices (``reduce_over_tokens`` adds)."""
        return bool(self._token_axes())

    def _token_axes(self) -> tuple[str, ...]:
        return tuple(a for name, axes in self.axes.items() if _is_token(name) for a in axes)

    def _start(self, name: str, local_length: int) -> jax.Array:
        axes = self.axes.get(name, ())
        if not axes:
            return jnp.uint32(0)
        return lax.axis_index(axes).astype(jnp.uint32) * jnp.uint32(local_length)

    def index_offset(self, rows: tuple[str, int] | None = None, cols: tuple[str, int] | None = None
                     ) -> jax.Array | None:
        """Global (row, column) of this device's block ``[0, 0]`` as the MXFP4 casts' uint32[2] ``index_offset``,
        from (dimension name, local length) of the block's rows and columns; None when neither is split, so an
        undivided call passes the same operands as the single-device op."""
        named = [dim for dim in (rows, cols) if dim is not None]
        if not self.splits(*(name for name, _ in named)):
            return None
        return jnp.stack([self._start(*dim) if dim is not None else jnp.uint32(0) for dim in (rows, cols)])

    def gather(self, x: jax.Array, **dims: int) -> jax.Array:
        """All-gather ``x`` along each array axis ``dims[name]`` over the mesh axes that split ``name``."""
        for name, axis in dims.items():
            axes = self.axes.get(name, ())
            if axes:
                x = lax.all_gather(x, axes, axis=axis, tiled=True)
        return x

    def reduce_over_tokens(self, partial: jax.Array, **dims: int) -> jax.Array:
        """Sum the per-device partial products of a contraction over tokens, leaving each device its block of the
        weight dimensions ``dims[name]`` (e.g. ``n=0, k=1``).

        Weight axes that also split tokens are reduce-scattered; weight axes that do not split tokens hold equal
        sums, so each device just keeps its block; token axes that split no weight dimension are all-reduced
        (after the reduce-scatter, on the smaller block). The sum is carried in float32 and rounded once to the
        partial's dtype.
        """
        tokens = self._token_axes()
        if not tokens and not self.splits(*dims):
            return partial
        x = partial.astype(jnp.float32) if tokens else partial
        scattered: tuple[str, ...] = ()
        for name, axis in dims.items():
            x = self._scatter(x, axis, self.axes.get(name, ()), tokens)
            scattered += self.axes.get(name, ())
        rest = tuple(a for a in tokens if a not in scattered)
        if rest:
            x = lax.psum(x, rest)
        return x.astype(partial.dtype)

    def _scatter(self, x: jax.Array, axis: int, axes: tuple[str, ...], tokens: tuple[str, ...]) -> jax.Array:
        if not axes:
            return x
        counts = tuple(self.sizes[a] for a in axes)
        local = x.shape[axis] // math.prod(counts)
        # One array axis per mesh axis, major first, as the block layout of the weight's sharding.
        x = x.reshape(x.shape[:axis] + counts + (local,) + x.shape[axis + 1:])
        for i in reversed(range(len(axes))):
            if axes[i] not in tokens:
                x = lax.dynamic_index_in_dim(x, lax.axis_index(axes[i]), axis + i, keepdims=False)
        reduced = tuple(a for a in axes if a in tokens)
        x = x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + len(reduced) + 1:])
        if reduced:
            x = lax.psum_scatter(x, reduced, scatter_dimension=axis, tiled=True)
        return x


UNSPLIT = Split({}, {})


def mesh_axes_of_dims(sharding: Any, shape: tuple[int, ...], mesh: Mesh) -> tuple[tuple[str, ...], ...]:
    """For each dimension of an array of ``shape`` placed by ``sharding``: the axes of ``mesh`` that split it,
    major first, or ``()`` when it is not split in a way whole mesh axes can name.

    The shardings that reach a custom partitioning rule are not decoded (a sharding over part of a mesh axis
    cannot be), so the axes are read from where the devices' blocks lie. Dimension ``d`` is split over axes
    ``(a1, ..., an)`` exactly when every device's block number along ``d`` is the mixed-radix number of its
    positions along ``a1..an`` (``a1`` most significant). The cases:

    * not divided (one block): ``()``;
    * divided over one axis, or over several in either order (``P(("x", "y"))`` gives ``("x", "y")``,
      ``P(("y", "x"))`` gives ``("y", "x")``); axes of size 1 never appear;
    * divided in a way no list of whole axes describes — over part of an axis (Shardy may propagate such blocks
      for shapes that straddle shards), or by devices in an order other than the mesh's: ``()``, so the op asks
      for that dimension whole and stays correct.
    """
    blocks = sharding.shard_shape(shape)
    indices = sharding.devices_indices_map(shape)
    positions = {device: position for position, device in np.ndenumerate(mesh.devices)}
    first = mesh.devices[(0,) * mesh.devices.ndim]
    neighbours = {name: mesh.devices[tuple(int(n == name) for n in mesh.axis_names)]
                  for name in mesh.axis_names if mesh.shape[name] > 1}
    axes_of_dims = []
    for dim, (length, block) in enumerate(zip(shape, blocks)):
        number = {device: (index[dim].start or 0) // block for device, index in indices.items()}
        # Block numbers one step along each axis from the first device, largest (major) first.
        steps = {name: number[device] - number[first] for name, device in neighbours.items()}
        axes = sorted((name for name in steps if steps[name]), key=steps.get, reverse=True)
        strides = [math.prod(mesh.shape[a] for a in axes[i + 1:]) for i in range(len(axes))]
        named = block < length and [steps[a] for a in axes] == strides and all(
            number[device] == sum(s * position[mesh.axis_names.index(a)] for a, s in zip(axes, strides))
            for device, position in positions.items())
        axes_of_dims.append(tuple(axes) if named else ())
    return tuple(axes_of_dims)


class LinearOp:
    """A custom-partitioned op ``local(static, split, *arrays) -> tuple of arrays``.

    ``operands`` / ``results``: one dimension spec per array (module docstring). ``multiples``: a named dimension
    stays split only when every block holds a multiple of ``multiples[name]`` (default 1) logical elements.
    ``static`` is hashable and passed through unchanged.

    Shardy's sharding rule comes from the specs: a named dimension is one factor across all arrays, so token
    shardings flow between activations and outputs and the weight's sharding to its copies and its gradient.
    Under ``jax.vmap`` the op is not partitioned: the batched call runs ``local`` with :data:`UNSPLIT`, which is
    what vmap of the undivided op always computed.
    """

    def __init__(self, local: Callable[..., tuple], *, operands: Sequence[str], results: Sequence[str],
                 multiples: Mapping[str, int] | None = None):
        self._local = local
        self._operands = tuple(_parse(s) for s in operands)
        self._results = tuple(_parse(s) for s in results)
        self._multiples = dict(multiples or {})
        # custom_partitioning refuses a body with closed-over constants (the casts' key words are concrete
        # arrays); behind a jit boundary they stay inside the body's own program.
        self._unsplit = jax.jit(lambda context, *arrays: local(context[0], UNSPLIT, *arrays), static_argnums=0)
        self._partitioned = custom_partitioning(self._unsplit, static_argnums=(0,))
        rule, factor_sizes = _sharding_rule(self._operands, self._results)
        # Shardings reach the partitioner undecoded: JAX fails on one over part of a mesh axis, which
        # mesh_axes_of_dims reads as undivided.
        self._partitioned.def_partition(self._partition, sharding_rule=rule, decode_shardings=False, **factor_sizes)

    def __call__(self, static: Any, *arrays: jax.Array) -> tuple:
        # The backend override in force at the call travels with it: the split program is traced later, when XLA
        # partitions, and must pick the implementations the undivided program picked.
        context = (static, _backend.current_overrides())

        @jax.custom_batching.custom_vmap
        def run(*arrays):
            return self._partitioned(context, *arrays)

        @run.def_vmap
        def _batched(axis_size, in_batched, *arrays):
            in_axes = tuple(0 if batched else None for batched in in_batched)
            outs = jax.vmap(functools.partial(self._unsplit, context), in_axes=in_axes)(*arrays)
            return outs, jax.tree.map(lambda _: True, outs)

        return run(*arrays)

    def _partition(self, context, mesh, arg_shapes, result_shapes):
        static, override = context
        if mesh.empty:
            raise ValueError("a sharded call of a jax_aiter GEMM needs a device mesh: place its operands with "
                             "NamedSharding")
        operands = [_expand(dims, len(a.shape)) for dims, a in zip(self._operands, arg_shapes)]
        results = [_expand(dims, len(r.shape)) for dims, r in zip(self._results, result_shapes)]
        split = self._split(mesh, operands, arg_shapes)

        def sharding(dims):
            entries = (split.axes.get(d.name, ()) for d in dims)
            return NamedSharding(mesh, PartitionSpec(*(a[0] if len(a) == 1 else a or None for a in entries)))

        def lower(*arrays):
            with _backend.overrides_in_force(override):
                return self._local(static, split, *arrays)

        return mesh, lower, tuple(map(sharding, results)), tuple(map(sharding, operands))

    def _split(self, mesh: Mesh, operands, arg_shapes) -> Split:
        """The first operand that has a dimension decides its axes; axes that do not divide it into whole blocks
        of its multiple are dropped (the dimension is then replicated)."""
        axes: dict[str, tuple[str, ...]] = {}
        for dims, arg in zip(operands, arg_shapes):
            placed = mesh_axes_of_dims(arg.sharding, tuple(arg.shape), mesh)
            for dim, length, dim_axes in zip(dims, arg.shape, placed):
                if dim.name == _REPLICATED or dim.name in axes:
                    continue
                count = math.prod(mesh.shape[a] for a in dim_axes) * self._multiples.get(dim.name, 1)
                axes[dim.name] = dim_axes if (length * dim.pack) % count == 0 else ()
        return Split({name: a for name, a in axes.items() if a}, dict(mesh.shape))


def _sharding_rule(operands, results) -> tuple[str, dict[str, int]]:
    """Shardy's rule and the sizes of the factors that only occur inside compound ones. Each named dimension is
    one factor shared by every array that has it; a packed one is a compound factor of the logical dimension
    whose major part is the length at the coarsest packing, so a split into whole blocks maps across packings."""
    packs: dict[str, set[int]] = {}
    for dims in operands + results:
        for dim in dims:
            if dim.name not in (_REPLICATED, _LEADING):
                packs.setdefault(dim.name, set()).add(dim.pack)
    factor_sizes: dict[str, int] = {}
    chains: dict[tuple[str, int], str] = {}
    for name, used in packs.items():
        order = sorted(used, reverse=True)
        factors = [name] + [f"{name}{i}" for i in range(1, len(order))]
        for j, pack in enumerate(order):
            chains[name, pack] = factors[0] if j == 0 else f"({' '.join(factors[:j + 1])})"
        factor_sizes.update({factors[i]: order[i - 1] // order[i] for i in range(1, len(order))})
    fresh = (f"r{i}" for i in itertools.count())

    def side(arrays):
        return ", ".join(" ".join(dim.name if dim.name == _LEADING else next(fresh) if dim.name == _REPLICATED
                                  else chains[dim.name, dim.pack] for dim in dims) for dims in arrays)

    return f"{side(operands)} -> {side(results)}", factor_sizes
