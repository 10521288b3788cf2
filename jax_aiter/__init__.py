"""jax-aiter: AMD AITER kernels for JAX, with a pure-JAX reference backend that runs everywhere.

Op families live in submodules (``jax_aiter.rmsnorm``, ``.activation``, ``.gemm``, ``.gemm_fp4``, and the
separately packaged ``jax_aiter.mha``). This module only exposes backend control and reporting.
"""

import os

import jax_aiter._optional  # noqa: F401  (a missing jax_aiter.mha names the package to install)

# JAX_AITER_BACKEND is read and checked when the package is imported (docs/backends.md), by the backend registry,
# which imports jax. Without it, importing the package imports no jax (the CLI, `jax-aiter recipe --dry-run`).
if os.environ.get("JAX_AITER_BACKEND"):
    import jax_aiter._backend  # noqa: F401

__version__ = "0.1.0"
__all__ = ["export", "info", "use_backend", "__version__"]


def __getattr__(name: str):
    # Imported on first use, so that importing the package (the CLI, a runner's --dry-run) does not import jax.
    if name == "use_backend":
        from jax_aiter._backend import use_backend

        return use_backend
    if name == "export":
        from jax_aiter._export import export

        return export
    raise AttributeError(f"module 'jax_aiter' has no attribute {name!r}")


def info() -> str:
    """Per op and platform, the implementation a typical call takes on this machine, and why."""
    from jax_aiter import _report

    return _report.info()
