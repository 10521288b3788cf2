"""The training process of a recipe run: ``python -m jax_aiter.maxtext._train RESOLVED_JSON``.

Started by ``jax_aiter.maxtext.run`` with the run's XLA flags and environment: turns jax-aiter on in MaxText with
the mode's precision policy, puts the Llama 3.1 8B events into MaxText's MLPerf log and runs MaxText's
pre-training loop with the resolved arguments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m jax_aiter.maxtext._train RESOLVED_JSON")
    resolved = json.loads(Path(argv[0]).read_text())
    from absl import logging

    from jax_aiter.maxtext import _integration, _mlperf
    from jax_aiter.maxtext._resolve import MODES

    # MaxText reports each step (loss, step time) through absl at INFO, which absl hides unless asked.
    logging.set_verbosity(logging.INFO)
    policy = _integration.policy_for_mode(resolved["mode"])
    _integration.enable(policy)
    _mlperf.install(MODES[resolved["mode"]][2], repr(policy))
    from maxtext.trainers.pre_train import train

    train.main(resolved["maxtext_argv"])


if __name__ == "__main__":
    main(sys.argv[1:])
