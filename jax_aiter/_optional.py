"""Names the package to install when a separately packaged subpackage is missing.

``jax_aiter.mha`` is left out of two packages: the conda package ``jax-aiter-core``, to which the conda package
``jax-aiter-mha`` adds it (recipe/recipe.yaml), and the lite wheel ``jax-aiter-core``, which the full wheel
``jax-aiter`` replaces (scripts/wheels.py). Without it, ``import jax_aiter.mha`` would fail with Python's bare "No
module named 'jax_aiter.mha'"; importing this module appends a finder to the end of ``sys.meta_path`` that is asked
only after every real finder came up empty, and raises a ModuleNotFoundError (same ``name``, so callers that inspect
it keep working) that says what to install.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys

# Module: the conda package that adds it.
SEPARATE_PACKAGES: dict[str, str] = {"jax_aiter.mha": "jax-aiter-mha"}
# The lite wheel, which has no separately packaged module, and the full wheel that has them all.
LITE_WHEEL, FULL_WHEEL = "jax-aiter-core", "jax-aiter"


def _lite_wheel_installed() -> bool:
    # The conda packages ship the dist-info of jax-aiter (recipe/dist_info.py), never one of jax-aiter-core.
    try:
        importlib.metadata.distribution(LITE_WHEEL)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_module_message(fullname: str) -> str:
    package = SEPARATE_PACKAGES[fullname]
    if _lite_wheel_installed():
        return (f"No module named {fullname!r}: the installed wheel {LITE_WHEEL!r} leaves it out; the full wheel "
                f"{FULL_WHEEL!r} has it (pip uninstall {LITE_WHEEL}, then pip install {FULL_WHEEL})")
    return (f"No module named {fullname!r}: it ships in the separate package {package!r}, which is not installed "
            f"(conda install {package}, or pixi add {package})")


class _SeparatePackageFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in SEPARATE_PACKAGES:
            return None
        raise ModuleNotFoundError(missing_module_message(fullname), name=fullname)


sys.meta_path.append(_SeparatePackageFinder())
