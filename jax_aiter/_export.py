"""``jax_aiter.export``: ``jax.export.export`` for programs that contain jax-aiter's FFI custom calls.

JAX refuses to serialize custom calls without a compatibility guarantee. jax-aiter's targets (all named
``ja_*``) are versioned with the package, so an exported program runs where the same jax-aiter version is
installed; this wrapper finds the targets the program uses and disables the check for exactly those.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax

_TARGET = re.compile(r"stablehlo\.custom_call @(ja_\w+)")


# Platforms jax.export lowers for.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def export(fun: Callable, *, platforms: str | Sequence[str], **kwargs: Any) -> Callable[..., jax.export.Exported]:
    """Like ``jax.export.export(jax.jit(fun), platforms=...)``; returns a function of example arguments.

    ``platforms`` is one platform name or a sequence of them; ``disabled_checks`` given here are kept, on every
    call of the returned function, beside the ones for jax-aiter's own targets.
    """
    platforms = _check_platforms(platforms)
    extra_checks = tuple(kwargs.pop("disabled_checks", ()))
    jitted = fun if hasattr(fun, "trace") else jax.jit(fun)

    def exporter(*args, **call_kwargs) -> jax.export.Exported:
        text = jitted.trace(*args, **call_kwargs).lower(lowering_platforms=platforms).as_text()
        checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in sorted(set(_TARGET.findall(text)))]
        return jax.export.export(jitted, platforms=platforms, disabled_checks=[*checks, *extra_checks],
                                 **kwargs)(*args, **call_kwargs)

    return exporter


def _check_platforms(platforms: Any) -> tuple[str, ...]:
    names = (platforms,) if isinstance(platforms, str) else platforms
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"platforms must be a platform name or a sequence of them, got {platforms!r}") from None
    if not names or any(not isinstance(n, str) or n not in PLATFORMS for n in names):
        raise ValueError(f"platforms must name one or more of {PLATFORMS}, got {platforms!r}")
    return names
