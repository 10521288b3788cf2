"""jax-aiter inside upstream MaxText (``pip install 'jax-aiter[maxtext]'``; docs/recipes/mxfp4_llama3_8b_maxtext.md).

One call turns it on, without editing MaxText: :func:`enable` (``policy`` a ``jax_aiter.precision.PrecisionPolicy``)
makes MaxText's dense projections run the policy's recipe through ``gemm_fp4_bf16`` (MXFP4) or ``gemm_fp8`` (FP8
current scaling), and MaxText's ``attention=jax_aiter`` run ``jax_aiter.mha.flash_attn_func``. It replaces two
MaxText functions, checked against the MaxText versions it was tested with (:data:`TESTED_MAXTEXT_VERSIONS`);
:func:`disable` puts them back.

``jax-aiter recipe RECIPE --mode mxfp4|fp8|bf16 --out DIR`` runs a recipe (:data:`RECIPES`: ``llama3.1-8b`` on 8
GPUs, ``gpu-small`` on one GPU, ``cpu-tiny`` on 8 virtual CPU devices); ``--final-mode M`` adds a closing phase
in mode M (a second training process resumed from the first one's checkpoint); ``--dry-run`` prints the resolved
MaxText arguments, XLA flags and environment without importing jax. This module imports neither jax nor MaxText until a
function that needs them is called.
"""

from jax_aiter.maxtext._resolve import (ATTENTION_KERNEL, MODES, RECIPES, TESTED_MAXTEXT_VERSIONS, RecipeRun,
                                        TrainingRecipe, resolve)
from jax_aiter.maxtext._runner import recipe_command, run, versions

__all__ = ["ATTENTION_KERNEL", "MODES", "RECIPES", "TESTED_MAXTEXT_VERSIONS", "AiterQuantization", "RecipeRun",
           "TrainingRecipe", "disable", "enable", "enabled_policy", "policy_dot_general", "policy_for_mode",
           "recipe_command", "resolve", "run", "versions"]

# Names that need MaxText and jax, imported from jax_aiter.maxtext._integration on first use.
_INTEGRATION = ("AiterQuantization", "disable", "enable", "enabled_policy", "policy_dot_general", "policy_for_mode")


def __getattr__(name: str):
    if name in _INTEGRATION:
        try:
            from jax_aiter.maxtext import _integration
        except ModuleNotFoundError as err:
            if (err.name or "").partition(".")[0] != "maxtext":
                raise
            raise ModuleNotFoundError(f"jax_aiter.maxtext.{name} needs MaxText: pip install 'jax-aiter[maxtext]'",
                                      name="maxtext") from err
        return getattr(_integration, name)
    raise AttributeError(f"module 'jax_aiter.maxtext' has no attribute {name!r}")
