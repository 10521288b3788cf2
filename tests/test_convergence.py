import math

import pytest

from jax_aiter.examples import convergence, tiny_llama

pytest.importorskip("jax_aiter.mha")

# The default MXFP4 recipe must end within this fraction of BF16's own loss reduction (docs/convergence.md): the
# acceptance criterion of the recipe, not a rounding bound.
MARGIN = 0.05


def test_relative_gap_arithmetic():
    # Losses with short binary fractions: every mean, difference and the quotient are exact in float64.
    ref = convergence.Result("bf16", [4.0] * 3 + [1.0] * 10)
    other = convergence.Result("x", [4.0] * 3 + [1.75] * 10)
    assert convergence.relative_gap(other, ref) == 0.25
    assert convergence.relative_gap(ref, ref) == 0.0


@pytest.mark.slow
def test_default_recipe_converges_like_bf16(tmp_path):
    cfg = tiny_llama.Config(steps=60)
    results = convergence.run(cfg, ["mxfp4-default"])
    bf16, mxfp4 = results
    # A quarter of the uniform guess's loss: far below any run that has not learnt the task (a criterion, not a
    # rounding bound).
    assert bf16.final() < 0.25 * math.log(cfg.vocab), "the reference run itself must learn the task"
    gap = convergence.relative_gap(mxfp4, bf16)
    assert gap <= MARGIN, f"MXFP4 default recipe ends {gap:.1%} of BF16's progress above BF16 (margin {MARGIN:.0%})"
    # Quantization must change the run: identical curves would mean the FP4 path was never taken.
    assert mxfp4.losses != bf16.losses
    written = convergence.save(results, cfg, tmp_path)
    assert (tmp_path / "convergence.json") in written
