"""Decoder shapes by name for the convergence benchmark (``jax-aiter convergence --model NAME``).

Each is a ``tiny_llama.Config`` (shape, batch, sequence length, peak learning rate, default step count) and the
benchmark's defaults for it (warm-up, evaluation period and size). Vocabularies are bytes (256); a token corpus
replaces the vocabulary with its own (docs/convergence.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax

from jax_aiter.examples import tiny_llama

__all__ = ["MODELS", "Model", "parameter_count"]


@dataclasses.dataclass(frozen=True)
class Model:
    config: tiny_llama.Config
    warmup_steps: int
    eval_every: int
    eval_batches: int
    # False for a shape that only lowers here: its Adam state does not fit one accelerator.
    trainable: bool = True


MODELS = {
    # Seconds per 100 steps on a 2-core CPU; 300 steps stay under one epoch of the bundled 300 KB sample.
    "cpu-tiny": Model(tiny_llama.Config(vocab=256, seq_len=64, dim=128, layers=2, heads=4, kv_heads=2, mlp_dim=256,
                                        batch=8, steps=300, learning_rate=3e-3),
                      warmup_steps=30, eval_every=50, eval_batches=8),
    # The model of issue 18's measurement: 74.7 M parameters.
    "75m": Model(tiny_llama.Config(vocab=256, seq_len=1024, dim=768, layers=12, heads=12, kv_heads=3, mlp_dim=2048,
                                   batch=16, steps=2000, learning_rate=1e-3),
                 warmup_steps=100, eval_every=100, eval_batches=8),
    "350m": Model(tiny_llama.Config(vocab=256, seq_len=1024, dim=1024, layers=24, heads=16, kv_heads=4, mlp_dim=3840,
                                    batch=16, steps=2000, learning_rate=5e-4),
                  warmup_steps=100, eval_every=100, eval_batches=8),
    # Llama 3.1 8B's shape (rotary theta and its long-context scaling aside) at MLPerf's sequence length.
    "llama3.1-8b": Model(tiny_llama.Config(vocab=128256, seq_len=8192, dim=4096, layers=32, heads=32, kv_heads=8,
                                           mlp_dim=14336, batch=1, steps=1, learning_rate=3e-4),
                         warmup_steps=0, eval_every=1, eval_batches=1, trainable=False),
}


def parameter_count(cfg: tiny_llama.Config) -> int:
    """The number of parameters of ``tiny_llama.init_params(cfg)`` (computed from shapes, nothing allocated)."""
    shapes = jax.eval_shape(functools.partial(tiny_llama.init_params, cfg), jax.random.key(0))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
