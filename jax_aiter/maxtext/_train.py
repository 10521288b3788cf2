"""A training process of a recipe run: ``python -m jax_aiter.maxtext._train RESOLVED_JSON PHASE``.

Started by ``jax_aiter.maxtext.run`` with the run's XLA flags and environment, once per phase (``PHASE`` indexes
the resolved run's ``phases``: one, or two with a closing phase): checks that jax sees the recipe's devices, turns
jax-aiter on in MaxText with the phase's precision policy, puts the Llama 3.1 8B events into MaxText's MLPerf log
and runs MaxText's pre-training loop with the phase's arguments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jax_aiter.maxtext._resolve import MODES, RECIPES, TrainingRecipe


def check_devices(recipe: TrainingRecipe) -> None:
    """Exit with a message unless jax's default backend, the one MaxText builds its mesh from, is the recipe's
    hardware with exactly the recipe's number of devices (the mesh is ``ici_fsdp_parallelism`` = that number)."""
    import jax

    backend, count = jax.default_backend(), jax.device_count()
    if (backend, count) == (recipe.hardware, recipe.devices):
        return
    plural = "s" if recipe.devices > 1 else ""
    raise SystemExit(
        f"jax-aiter recipe {recipe.name}: needs {recipe.devices} {recipe.hardware.upper()} device{plural}, but "
        f"jax's default backend here has {count} {backend.upper()} device{'s' if count != 1 else ''} "
        f"({jax.devices()[0].device_kind}); {_DEVICE_HINTS[recipe.hardware]}")


_DEVICE_HINTS = {
    "gpu": "CUDA_VISIBLE_DEVICES (NVIDIA) or HIP_VISIBLE_DEVICES (AMD) selects the GPUs jax sees",
    "cpu": "JAX_PLATFORMS=cpu makes the CPU jax's default backend",
}


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m jax_aiter.maxtext._train RESOLVED_JSON PHASE")
    resolved = json.loads(Path(argv[0]).read_text())
    phase = resolved["phases"][int(argv[1])]
    check_devices(RECIPES[resolved["recipe"]])
    from absl import logging

    from jax_aiter.maxtext import _integration, _mlperf

    # MaxText reports each step (loss, step time) through absl at INFO, which absl hides unless asked.
    logging.set_verbosity(logging.INFO)
    policy = _integration.policy_for_mode(phase["mode"])
    _integration.enable(policy)
    _mlperf.install(MODES[phase["mode"]].mlperf_precision, repr(policy))
    from maxtext.trainers.pre_train import train

    train.main(phase["maxtext_argv"])


if __name__ == "__main__":
    main(sys.argv[1:])
