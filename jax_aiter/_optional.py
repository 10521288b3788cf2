"""Names the package to install when a separately packaged subpackage is missing.

The conda packages split jax_aiter: ``jax_aiter.mha`` ships as ``jax-aiter-mha`` (recipe/recipe.yaml). Without it,
``import jax_aiter.mha`` would fail with Python's bare "No module named 'jax_aiter.mha'"; importing this module
appends a finder to the end of ``sys.meta_path`` that is asked only after every real finder came up empty, and
raises a ModuleNotFoundError (same ``name``, so callers that inspect it keep working) that says what to install.
"""

from __future__ import annotations

import importlib.abc
import sys

SEPARATE_PACKAGES: dict[str, str] = {"jax_aiter.mha": "jax-aiter-mha"}


class _SeparatePackageFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        package = SEPARATE_PACKAGES.get(fullname)
        if package is None:
            return None
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: it ships in the separate package {package!r}, which is not installed "
            f"(conda install {package}, or pixi add {package})", name=fullname)


sys.meta_path.append(_SeparatePackageFinder())
