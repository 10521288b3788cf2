"""Convergence harness: does an MXFP4 recipe train like BF16?

Trains the tiny Llama-style model (``tiny_llama``) from the same seed and data order once with BF16 GEMMs and
once per MXFP4 recipe (every projection through ``gemm_fp4_bf16``), then reports each recipe's final loss and
its gap to BF16. The gap is judged relative to how far BF16 itself moved: ``gap / (bf16_initial - bf16_final)``,
so the verdict does not depend on the task's absolute loss scale.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from jax_aiter.examples import tiny_llama
from jax_aiter.gemm_fp4 import Mxfp4Recipe

RECIPES = {"mxfp4-default": Mxfp4Recipe.default, "mxfp4-gradient-hadamard": Mxfp4Recipe.gradient_hadamard}


@dataclasses.dataclass(frozen=True)
class Result:
    name: str
    losses: list[float]

    def final(self, window: int = 10) -> float:
        tail = self.losses[-window:]
        return sum(tail) / len(tail)

    def initial(self, window: int = 3) -> float:
        head = self.losses[:window]
        return sum(head) / len(head)


def run(cfg: tiny_llama.Config, recipes: list[str], on_step=None) -> list[Result]:
    results = [Result("bf16", tiny_llama.train(cfg, None, on_step and functools.partial(on_step, "bf16")))]
    for name in recipes:
        losses = tiny_llama.train(cfg, RECIPES[name](), on_step and functools.partial(on_step, name))
        results.append(Result(name, losses))
    return results


def relative_gap(result: Result, reference: Result) -> float:
    progress = reference.initial() - reference.final()
    return (result.final() - reference.final()) / progress


def summary(results: list[Result]) -> dict:
    reference = results[0]
    return {
        "reference": reference.name,
        "runs": {r.name: {"final_loss": r.final(), "relative_gap": relative_gap(r, reference), "losses": r.losses}
                 for r in results},
    }


def save(results: list[Result], cfg: tiny_llama.Config, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"config": dataclasses.asdict(cfg), **summary(results)}
    written = [out_dir / "convergence.json"]
    written[0].write_text(json.dumps(data, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return written  # the plot is optional; the JSON holds every number
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot(r.losses, label=f"{r.name} (final {r.final():.3f})", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("tiny Llama: BF16 vs MXFP4 recipes (same seed and data)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "convergence.png", dpi=120)
    plt.close(fig)
    written.append(out_dir / "convergence.png")
    return written
