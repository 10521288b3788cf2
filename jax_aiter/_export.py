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


def export(fun: Callable, *, platforms: Sequence[str], **kwargs: Any) -> Callable[..., jax.export.Exported]:
    """Like ``jax.export.export(jax.jit(fun), platforms=...)``; returns a function of example arguments."""
    jitted = fun if hasattr(fun, "trace") else jax.jit(fun)

    def exporter(*args, **call_kwargs) -> jax.export.Exported:
        text = jitted.trace(*args, **call_kwargs).lower(lowering_platforms=tuple(platforms)).as_text()
        checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in sorted(set(_TARGET.findall(text)))]
        checks += list(kwargs.pop("disabled_checks", ()))
        return jax.export.export(jitted, platforms=platforms, disabled_checks=checks, **kwargs)(*args, **call_kwargs)

    return exporter
