"""``jax_aiter.info()`` and ``jax-aiter info``: per op and platform, the implementation a typical call takes on
this machine and why better-ranked ones were skipped.

This module imports every op module (the separately packaged ``jax_aiter.mha`` when it is installed) so the table
covers every op; the op modules never import it.
"""

from __future__ import annotations

import jax

from jax_aiter import _backend, _native
from jax_aiter import activation, gemm, gemm_fp4, gemm_fp8, rmsnorm  # noqa: F401  (declare their ops)

# `import jax_aiter.mha`, not `from jax_aiter import mha`: the latter turns the ModuleNotFoundError of a missing
# subpackage into an ImportError ("cannot import name").
try:
    import jax_aiter.mha  # noqa: F401
except ModuleNotFoundError as err:  # shipped separately (jax-aiter-mha, or the full wheel jax-aiter)
    if err.name is None or not err.name.startswith("jax_aiter"):
        raise


def info(platforms: tuple[str, ...] = _backend.PLATFORMS) -> str:
    """A table of every op, per platform, the implementation a typical call takes on this machine, and why."""
    present = _backend.present_platforms()
    lines = [f"jax {jax.__version__}; devices here: {', '.join(sorted(present)) or 'none'}"]
    lines += [f"  {line}" for line in _native.describe()]
    width = max(len(op) for op in _backend.defined_ops())
    for choice in _backend.report(platforms):
        mark = "*" if choice.present else " "
        line = f"{mark} {choice.op:<{width}}  {choice.platform:<5} -> {choice.selected}"
        if choice.note:
            line += f" [{choice.note}]"
        if choice.rejected:
            line += "   (" + "; ".join(f"{name}: {why}" for name, why in choice.rejected) + ")"
        lines.append(line)
    lines.append("* = platform present on this machine")
    return "\n".join(lines)
