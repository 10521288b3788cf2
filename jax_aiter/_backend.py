"""Which implementation runs an op, decided per target platform when the program is lowered.

Every public op calls :func:`dispatch`. For each platform JAX can lower to (cpu, cuda, rocm) it picks the
first implementation, in preference order ``aiter > native > cudnn > xla``, that

* exists for that platform,
* has its native library loaded in this process (platforms this machine does not have are exempt when the
  implementation is forced, so a CPU machine can lower and export a program for ROCm), and
* supports this call (dtype, shape, options), as judged by the implementation's ``supports`` check, and
* does not reserve this call for when it is forced (its ``forced_only`` check: e.g. AITER's RMSNorm outside
  float16, whose range is narrower than the op's contract; or ``forced_only_on`` for the platform: e.g. the
  C++ kernels on the CPU, slower than XLA's code there).

The per-platform choices are combined with :func:`jax.lax.platform_dependent`, so a program traced here lowers
correctly for any platform. The ``xla`` implementation (pure JAX, ``jax_aiter/ref``) exists for every op and
platform and defines the numerics.

Each op module (``jax_aiter.rmsnorm``, ...) declares its op with :func:`define_op` in one block that lists every
implementation; the implementation modules (``jax_aiter.ref``, ``.native``, ``.aiter``, ``jax_aiter.mha._cudnn``)
are leaves that import neither this module's registry nor an op module.

Overrides, in increasing precedence: the environment variable ``JAX_AITER_BACKEND`` (read when jax_aiter is
imported) and the :func:`use_backend` context manager (part of jit's cache key). Both take an implementation
name for all ops (``"xla"``) and/or per-op names (``"rms_norm=native,gemm=xla"``); an unknown op or
implementation name is an error. A forced implementation that does not support the call raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from jax_aiter import _native

PLATFORMS: tuple[str, ...] = ("cpu", "cuda", "rocm")
PREFERENCE: tuple[str, ...] = ("aiter", "native", "cudnn", "xla")
ENV_VAR = "JAX_AITER_BACKEND"

SupportsFn = Callable[..., "str | None"]


# Every op, with the module that declares it and its implementations. Overrides are checked against this list
# without importing the op modules (this module imports none of them); define_op refuses a name missing here.
OPS: dict[str, str] = {
    "rms_norm": "jax_aiter.rmsnorm",
    "rms_norm_with_add": "jax_aiter.rmsnorm",
    "silu_and_mul": "jax_aiter.activation",
    "gemm": "jax_aiter.gemm",
    "gemm_fp4": "jax_aiter.gemm_fp4",
    "gemm_bf16_fp4": "jax_aiter.gemm_fp4",
    "gemm_fp8": "jax_aiter.gemm_fp8",
    "cast_mxfp4": "jax_aiter.gemm_fp4",
    "cast_mxfp4_dual": "jax_aiter.gemm_fp4",
    "flash_attn": "jax_aiter.mha",
    "flash_attn_varlen": "jax_aiter.mha",
}


@dataclasses.dataclass(frozen=True, eq=False)
class Implementation:
    """One way to compute an op. ``fn(*args, **params)`` returns the op's outputs and is differentiable.

    ``library`` names the native library it needs: one name for every platform, or a ``{platform: library}``
    mapping when each platform has its own build; ``targets`` the FFI targets it calls, which that library must
    export. ``supports(*args, **params)`` returns None when the call is served, else the reason it is not;
    ``forced_only(*args, **params)``, when given, the reason a call it serves is still left to the next
    implementation unless this one is forced (e.g. a narrower numeric range than the op's contract), or None.
    """

    name: str
    fn: Callable[..., Any]
    platforms: tuple[str, ...] = PLATFORMS
    library: str | Mapping[str, str] | None = None
    targets: tuple[str, ...] = ()
    supports: SupportsFn | None = None
    forced_only: SupportsFn | None = None
    # Per platform, a variant of ``fn`` and why it is used there: e.g. XLA's own fusions where they measured
    # faster than the kernels (silu_and_mul on CUDA).
    variants: Mapping[str, tuple[Callable[..., Any], str]] = dataclasses.field(default_factory=dict)
    # Per platform, why the default there is the next implementation (measured faster, e.g. XLA's CPU code against
    # a single-threaded kernel); forced, this one still runs there, so its tests keep running the kernel.
    forced_only_on: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.name not in PREFERENCE:
            raise ValueError(f"implementation name {self.name!r} is not one of {PREFERENCE}")

    def library_for(self, platform: str) -> str | None:
        if platform not in self.platforms:
            return None
        if isinstance(self.library, str):
            return self.library
        return None if self.library is None else self.library.get(platform)

    def fn_for(self, platform: str) -> Callable[..., Any]:
        return self.variants[platform][0] if platform in self.variants else self.fn

    def note_for(self, platform: str) -> str | None:
        return self.variants[platform][1] if platform in self.variants else None

    def unsupported_reason(self, args: tuple, params: Mapping[str, Any]) -> str | None:
        return None if self.supports is None else self.supports(*args, **params)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """An op, its implementations in preference order, and a representative call, used by :func:`report` to say
    what a typical call would take."""

    name: str
    example: Callable[[], tuple[tuple, dict]]
    implementations: tuple[Implementation, ...]


_OPS: dict[str, OpSpec] = {}
_warned_libraries: set[str] = set()


def define_op(name: str, *, example: Callable[[], tuple[tuple, dict]],
              implementations: tuple[Implementation, ...]) -> None:
    """Declare op ``name`` with every implementation it has; the ``xla`` one is required."""
    if name not in OPS:
        raise KeyError(f"op {name!r} is not listed in jax_aiter._backend.OPS")
    names = [impl.name for impl in implementations]
    if "xla" not in names or len(set(names)) != len(names):
        raise ValueError(f"{name}: implementations {names} must be distinct and include 'xla'")
    ordered = tuple(sorted(implementations, key=lambda impl: PREFERENCE.index(impl.name)))
    _OPS[name] = OpSpec(name, example, ordered)


def defined_ops() -> tuple[str, ...]:
    """The ops whose modules have been imported, in the order of :data:`OPS`."""
    return tuple(op for op in OPS if op in _OPS)


def implementations(op: str) -> list[Implementation]:
    return list(_OPS[op].implementations)


# --- overrides -------------------------------------------------------------------------------------------


def _parse_override(text: str, source: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, sep, impl = item.partition("=")
        key, value = ("*", op.strip()) if not sep else (op.strip(), impl.strip())
        if value not in PREFERENCE:
            raise ValueError(f"{source}: unknown implementation {value!r} in {item!r}; expected one of {PREFERENCE}")
        if key != "*" and key not in OPS:
            raise ValueError(f"{source}: unknown op {key!r} in {item!r}; known ops are {sorted(OPS)}")
        result[key] = value
    return result


def _as_key(table: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(table.items()))


# The override is a JAX user context: it is part of jit's cache key, so a function traced under one override is
# re-traced under another instead of silently reusing the first choice. The environment variable sets its
# process-wide value once, when jax_aiter is imported.
_override = jax.make_user_context(default_value=())
_override.set_global(_as_key(_parse_override(os.environ.get(ENV_VAR, ""), f"environment variable {ENV_VAR}")))


@contextlib.contextmanager
def use_backend(default: str | None = None, **per_op: str) -> Iterator[None]:
    """Force implementations inside a ``with`` block: ``use_backend("xla")``, ``use_backend(gemm="xla")``.

    Per-op names win over the default; the block's choices win over the environment variable.
    """
    for name, value in (("default", default), *per_op.items()):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"use_backend: {name} must be an implementation name (str), got {type(value).__name__}")
    spec = ",".join(([default] if default else []) + [f"{k}={v}" for k, v in per_op.items()])
    forced = _parse_override(spec, "use_backend")
    current = dict(_override.value)
    if "*" in forced:  # a new default replaces per-op choices made outside the block
        current = {}
    with _override(_as_key({**current, **forced})):
        yield


def forced_implementation(op: str) -> str | None:
    table = dict(_override.value)
    return table.get(op, table.get("*"))


def current_overrides() -> tuple[tuple[str, str], ...]:
    """The overrides in force, as a hashable value for :func:`overrides_in_force` (e.g. to re-enter them when a
    program is traced later, as a custom partitioning rule is)."""
    return _override.value


def overrides_in_force(overrides: tuple[tuple[str, str], ...]):
    """A context in which exactly ``overrides`` (from :func:`current_overrides`) are in force."""
    return _override(overrides)


# --- selection -------------------------------------------------------------------------------------------


present_platforms = _native.present_platforms


def _library_problem(impl: Implementation, platform: str) -> str | None:
    library = impl.library_for(platform)
    if library is None:
        return None
    loaded = _native.load(library)
    if loaded.problem is not None:
        return loaded.problem
    missing = loaded.missing_targets(impl.targets)
    if missing:
        return f"{loaded.path.name} lacks FFI target(s) {', '.join(missing)} (a stale build; reinstall jax-aiter)"
    return None


def _status(impl: Implementation, platform: str, args: tuple, params: Mapping[str, Any], forced: bool) -> str | None:
    """None when ``impl`` can serve this call on ``platform``, else the reason it cannot."""
    if platform not in impl.platforms:
        return f"not implemented for {platform}"
    problem = _library_problem(impl, platform)
    if problem is not None and not (forced and platform not in present_platforms()):
        return problem
    reason = impl.unsupported_reason(args, params)
    if reason is not None or forced:
        return reason
    if platform in impl.forced_only_on:
        return impl.forced_only_on[platform]
    return None if impl.forced_only is None else impl.forced_only(*args, **params)


def select(op: str, platform: str, args: tuple, params: Mapping[str, Any]) -> Implementation:
    spec = _OPS[op]
    forced = forced_implementation(op)
    if forced is not None:
        matches = [i for i in spec.implementations if i.name == forced]
        if not matches:
            raise ValueError(f"{op}: implementation {forced!r} is forced but {op} has only "
                             f"{[i.name for i in spec.implementations]}")
        impl = matches[0]
        if platform in impl.platforms:
            reason = _status(impl, platform, args, params, forced=True)
            if reason is not None:
                raise ValueError(f"{op}: forced implementation {forced!r} cannot run this call on {platform}: {reason}")
            return impl
    for impl in spec.implementations:
        reason = _status(impl, platform, args, params, forced=False)
        if reason is None:
            return impl
        problem = _library_problem(impl, platform)
        if platform in present_platforms() and problem:
            _warn_unusable_library(impl.library_for(platform), problem)
    raise RuntimeError(f"{op}: no implementation for {platform}; the xla implementation must always be registered")


def _warn_unusable_library(library: str, problem: str) -> None:
    if library in _warned_libraries:
        return
    _warned_libraries.add(library)
    warnings.warn(f"jax_aiter: {problem}; ops fall back to the next implementation", RuntimeWarning, stacklevel=4)


def dispatch(op: str, *args: Any, **params: Any) -> Any:
    """Run ``op`` on ``args`` with the implementation each platform selects for this call."""
    chosen = {platform: select(op, platform, args, params).fn_for(platform) for platform in PLATFORMS}
    distinct = set(chosen.values())
    if len(distinct) == 1:
        return next(iter(distinct))(*args, **params)
    reference = select_reference(op)
    branches = {p: functools.partial(fn, **params) for p, fn in chosen.items()}
    return jax.lax.platform_dependent(*args, default=functools.partial(reference.fn, **params), **branches)


def select_reference(op: str) -> Implementation:
    return next(i for i in _OPS[op].implementations if i.name == "xla")


# --- reporting -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Choice:
    op: str
    platform: str
    present: bool
    selected: str
    rejected: tuple[tuple[str, str], ...]
    note: str | None = None  # how the selected implementation runs on this platform, when it has a variant


def report(platforms: tuple[str, ...] = PLATFORMS) -> list[Choice]:
    """For each op and platform: the implementation a typical call takes and why better-ranked ones were skipped."""
    choices = []
    for spec in (_OPS[op] for op in defined_ops()):
        args, params = spec.example()
        for platform in platforms:
            rejected = []
            selected = "none"
            note = None
            for impl in spec.implementations:
                if platform not in impl.platforms:
                    continue
                reason = _status(impl, platform, args, params, forced=False)
                if reason is None:
                    selected = impl.name
                    note = impl.note_for(platform)
                    break
                rejected.append((impl.name, reason))
            forced = forced_implementation(spec.name)
            if forced is not None:
                selected = f"{forced} (forced; would be {selected})"
            choices.append(Choice(spec.name, platform, platform in present_platforms(), selected, tuple(rejected),
                                  note))
    return choices
