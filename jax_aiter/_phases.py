"""Where a run's closing phase starts: the one rule shared by ``PrecisionSchedule`` and the MaxText runner's
resolution (which must not import jax, so that a dry run needs none)."""

from __future__ import annotations


def closing_phase_start(steps: int, final_fraction: float) -> int:
    """The first (0-based) of ``steps`` steps in the closing phase, which takes the last
    ``round(steps · final_fraction)`` of them. Raises ValueError when that leaves one of the two phases without a
    step."""
    first = steps - round(steps * final_fraction)
    if not 0 < first < steps:
        raise ValueError(f"final_fraction {final_fraction} of {steps} steps leaves a phase without steps")
    return first
