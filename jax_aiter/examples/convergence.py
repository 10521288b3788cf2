"""Convergence benchmark: does a precision policy train like BF16 on real text?

Trains the Llama-style decoder of ``tiny_llama`` (a shape from ``models.MODELS``) on a text corpus
(``text_data``) once per arm, an arm being a ``PrecisionPolicy``. Every arm starts from the same weights and sees
the same batches in the same order (both are hashed and the hashes compared across arms); Adam with linear
warm-up, cosine decay to ``final_lr_fraction`` of the peak and global-norm gradient clipping. Every
``eval_every`` steps the held-out loss is measured on the same fixed held-out batches.

The gap of an arm is ``(loss_arm - loss_bf16) / loss_bf16``: held-out on the mean of the last
:data:`FINAL_EVALS` evaluations after training started (the last is at the final step), train on the mean
training loss of the last :data:`FINAL_TRAIN_FRACTION` of the steps. Results go to ``convergence.json`` (every
curve), ``convergence.png`` and, with the optional ``mlperf-logging`` package, one MLPerf-format log per arm
(``mllog/<arm>.log``). Arms trained by separate calls with the same setup merge into one ``convergence.json``.
Several seeds give one such directory per seed and ``seeds.json``, the paired gaps' mean and spread over seeds
(:func:`seed_summary`): a gap smaller than the run-to-run spread is not a result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import math
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter.examples import models, text_data, tiny_llama
from jax_aiter.gemm_fp4 import Mxfp4Recipe
from jax_aiter.precision import PrecisionPolicy, PrecisionSchedule

__all__ = ["ARMS", "DEFAULT_ARMS", "FINAL_EVALS", "FINAL_TRAIN_FRACTION", "GAP_DEFINITION", "OVERRIDES", "REFERENCE",
           "SEED_SUMMARY_DEFINITION", "Arm", "Data", "MlperfLog", "Setup", "SetupMismatch", "bundled_sample",
           "copy_mllogs", "gaps", "load_data", "load_results", "lower_step", "make_step", "merge", "merge_directory",
           "open_mllog", "save", "save_seed_summary", "seed_directory", "seed_summary", "seed_tables", "train_arm"]

REFERENCE = "bf16"
FINAL_EVALS = 3
FINAL_TRAIN_FRACTION = 0.1
# What `jax-aiter convergence` may override on a model's defaults (Setup.for_model).
OVERRIDES = ("steps", "batch", "seq_len", "learning_rate", "seed", "warmup_steps", "eval_every", "eval_batches")


@dataclasses.dataclass(frozen=True)
class Arm:
    """What an arm trains with: a precision policy, or a :class:`~jax_aiter.precision.PrecisionSchedule` whose
    closing policy trains the last steps (a wider format, as in FP4 work that ends training in higher precision).
    A policy is held as the one-phase schedule. The held-out loss after a step is measured under the policy that
    trained that step."""

    schedule: PrecisionSchedule
    description: str

    def __post_init__(self) -> None:
        if isinstance(self.schedule, PrecisionPolicy):
            object.__setattr__(self, "schedule", PrecisionSchedule(self.schedule))
        elif not isinstance(self.schedule, PrecisionSchedule):
            raise TypeError(f"schedule must be a PrecisionSchedule or a PrecisionPolicy, got "
                            f"{type(self.schedule).__name__}")

    @property
    def policy(self) -> PrecisionPolicy:
        return self.schedule.policy

    @property
    def final_policy(self) -> PrecisionPolicy | None:
        return self.schedule.final_policy

    def final_from(self, steps: int) -> int:
        """:meth:`PrecisionSchedule.final_from`."""
        return self.schedule.final_from(steps)


_SR_GRAD = Mxfp4Recipe(gradient_stochastic=True)
_SIGNED = Mxfp4Recipe.keyed_hadamard()
_SIGNED_CEIL = dataclasses.replace(_SIGNED, activation_scale_rule="ceil", weight_scale_rule="ceil",
                                   gradient_scale_rule="ceil")


def _every_block(recipe: Mxfp4Recipe | None = None, **blocks: Any) -> PrecisionPolicy:
    """``recipe`` (default ``Mxfp4Recipe.default()``) on the blocks but those ``blocks`` names: the arms measured
    before the default policy kept a share of the blocks in BF16 keep their meaning."""
    return PrecisionPolicy.mxfp4(Mxfp4Recipe.default() if recipe is None else recipe, bf16_last_fraction=0.0,
                                 **blocks)


ARMS = {
    REFERENCE: Arm(PrecisionPolicy.bf16(), "every projection BF16 (the reference)"),
    "fp8": Arm(PrecisionPolicy.fp8(), "FP8 current scaling (E4M3 forward, E5M2 gradients) on the blocks, LM head "
               "and embedding BF16"),
    "fp8-all": Arm(PrecisionPolicy.fp8(lm_head=True), "FP8 current scaling on every projection, LM head included"),
    "mxfp4": Arm(PrecisionPolicy.mxfp4(), "the default MXFP4 policy: Mxfp4Recipe.keyed_hadamard() on the blocks but "
                 "the last third, those, the LM head and the embedding BF16"),
    "mxfp4-every-block": Arm(_every_block(), "Mxfp4Recipe.default() on every block, LM head and embedding BF16 (the "
                             "default policy until 2026-12-03)"),
    "mxfp4-every-block-weights-once": Arm(
        dataclasses.replace(_every_block(), quantize_weights_once=True),
        "mxfp4-every-block with the weights' copies made once per step, one cast per width (the same bits)"),
    "mxfp4-all": Arm(_every_block(lm_head=True), "Mxfp4Recipe.default() on every projection, LM head included"),
    "mxfp4-sr-grad": Arm(_every_block(_SR_GRAD),
                         "Mxfp4Recipe.default() on every block, stochastic rounding of the gradient"),
    "mxfp4-gradient-hadamard": Arm(_every_block(Mxfp4Recipe.gradient_hadamard()),
                                   "paired Hadamard 16 on dgrad and wgrad"),
    "mxfp4-gradient-hadamard-all": Arm(_every_block(Mxfp4Recipe.gradient_hadamard(), lm_head=True),
                                       "paired Hadamard 16 on dgrad and wgrad, LM head included"),
    "mxfp4-gradient-hadamard-sr-grad": Arm(
        _every_block(Mxfp4Recipe(dgrad_hadamard=16, gradient_stochastic=True)),
        "paired Hadamard 16 on dgrad and wgrad + stochastic rounding of the gradient"),
    "mxfp4-signed-hadamard": Arm(_every_block(_SIGNED),
                                 "Mxfp4Recipe.keyed_hadamard() on every block"),
    "mxfp4-wgrad-h32": Arm(_every_block(Mxfp4Recipe(wgrad_hadamard=32)), "paired Hadamard 32 on wgrad"),
    "mxfp4-fprop-hadamard": Arm(_every_block(Mxfp4Recipe(fprop_hadamard=16)),
                                "paired Hadamard 16 on fprop and wgrad"),
    "mxfp4-scale-ceil": Arm(_every_block(Mxfp4Recipe(activation_scale_rule="ceil", weight_scale_rule="ceil",
                                                     gradient_scale_rule="ceil")),
                            "Mxfp4Recipe.default() with the never-saturating 'ceil' scale rule for every role"),
    "mxfp4-weight-tiles": Arm(_every_block(Mxfp4Recipe(weight_tile_scaling=True)),
                              "Mxfp4Recipe.default() with one scale per 32 x 32 weight tile (fprop and dgrad share "
                              "the weight)"),
    "mxfp4-bf16-last2": Arm(_every_block(bf16_last_blocks=2), "Mxfp4Recipe.default(), the last 2 blocks BF16"),
    "mxfp4-bf16-first1-last1": Arm(_every_block(bf16_first_blocks=1, bf16_last_blocks=1),
                                   "Mxfp4Recipe.default(), the first and the last block BF16"),
    "mxfp4-signed-hadamard-bf16-last2": Arm(_every_block(_SIGNED, bf16_last_blocks=2),
                                            "keyed random-sign Hadamard (hadamard_seed=0), the last 2 blocks BF16"),
    "mxfp4-signed-hadamard-bf16-first1-last2": Arm(
        _every_block(_SIGNED, bf16_first_blocks=1, bf16_last_blocks=2),
        "keyed random-sign Hadamard (hadamard_seed=0), the first block and the last 2 blocks BF16"),
    "mxfp4-signed-hadamard-bf16-last3": Arm(_every_block(_SIGNED, bf16_last_blocks=3),
                                            "keyed random-sign Hadamard (hadamard_seed=0), the last 3 blocks BF16"),
    "mxfp4-signed-hadamard-bf16-last4": Arm(_every_block(_SIGNED, bf16_last_blocks=4),
                                            "keyed random-sign Hadamard (hadamard_seed=0), the last 4 blocks BF16"),
    "mxfp4-signed-hadamard-bf16-last6": Arm(_every_block(_SIGNED, bf16_last_blocks=6),
                                            "keyed random-sign Hadamard (hadamard_seed=0), the last 6 blocks BF16"),
    "mxfp4-signed-gradient-hadamard-bf16-last4": Arm(
        _every_block(dataclasses.replace(_SIGNED, dgrad_hadamard=16), bf16_last_blocks=4),
        "keyed random-sign Hadamard 16 (hadamard_seed=0) on both gradient GEMMs (dgrad and wgrad), the last 4 blocks "
        "BF16"),
    "mxfp4-signed-hadamard-sr-grad-bf16-last4": Arm(
        _every_block(dataclasses.replace(_SIGNED, gradient_stochastic=True), bf16_last_blocks=4),
        "keyed random-sign Hadamard (hadamard_seed=0) on wgrad, stochastic rounding of the gradient, the last 4 "
        "blocks BF16"),
    "mxfp4-signed-hadamard-scale-ceil-bf16-last2": Arm(
        _every_block(_SIGNED_CEIL, bf16_last_blocks=2),
        "keyed random-sign Hadamard (hadamard_seed=0), the 'ceil' scale rule for every role, the last 2 blocks BF16"),
    "mxfp4-signed-fprop-hadamard-bf16-last4": Arm(
        _every_block(dataclasses.replace(_SIGNED, fprop_hadamard=16), bf16_last_blocks=4),
        "keyed random-sign Hadamard 16 (hadamard_seed=0) on fprop as well as wgrad, the last 4 blocks BF16"),
    "mxfp4-signed-wgrad-h32-bf16-last4": Arm(
        _every_block(dataclasses.replace(_SIGNED, wgrad_hadamard=32), bf16_last_blocks=4),
        "keyed random-sign Hadamard 32 (hadamard_seed=0) on wgrad, the last 4 blocks BF16"),
    "mxfp4-signed-hadamard-scale-ceil-bf16-last4": Arm(
        _every_block(_SIGNED_CEIL, bf16_last_blocks=4),
        "keyed random-sign Hadamard (hadamard_seed=0), the 'ceil' scale rule for every role, the last 4 blocks BF16"),
    "mxfp4-then-fp8": Arm(PrecisionSchedule(_every_block(), PrecisionPolicy.fp8(), 0.1),
                          "Mxfp4Recipe.default() on every block, then FP8 current scaling for the last 10 % of the "
                          "steps"),
    "mxfp4-then-fp8-last25": Arm(PrecisionSchedule(_every_block(), PrecisionPolicy.fp8(), 0.25),
                                 "Mxfp4Recipe.default() on every block, then FP8 current scaling for the last 25 % "
                                 "of the steps"),
    "mxfp4-signed-hadamard-bf16-last2-then-fp8-last25": Arm(
        PrecisionSchedule.mxfp4_then_fp8(), "keyed random-sign Hadamard (hadamard_seed=0), the last 2 blocks BF16, "
        "then FP8 current scaling for the last 25 % of the steps"),
    "mxfp4-then-bf16": Arm(PrecisionSchedule(_every_block(), PrecisionPolicy.bf16(), 0.1),
                           "Mxfp4Recipe.default() on every block, then BF16 for the last 10 % of the steps"),
}
DEFAULT_ARMS = (REFERENCE, "fp8", "mxfp4", "mxfp4-all")


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything that must be equal for arms to be compared: model, data sizes, schedule, evaluation."""

    model: str
    config: tiny_llama.Config
    warmup_steps: int
    eval_every: int
    eval_batches: int
    final_lr_fraction: float = 0.1
    clip_norm: float = 1.0
    held_out_fraction: float = 0.05

    def __post_init__(self) -> None:
        cfg = self.config
        for name, value, least in (("steps", cfg.steps, 1), ("batch", cfg.batch, 1), ("seq_len", cfg.seq_len, 1),
                                   ("warmup_steps", self.warmup_steps, 0), ("eval_every", self.eval_every, 1),
                                   ("eval_batches", self.eval_batches, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if self.warmup_steps >= cfg.steps:
            raise ValueError(f"warmup_steps = {self.warmup_steps} must be below steps = {cfg.steps}")
        if not cfg.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {cfg.learning_rate}")
        if not 0 <= self.final_lr_fraction <= 1:
            raise ValueError(f"final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}")
        if not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if not 0 < self.held_out_fraction < 1:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {self.held_out_fraction}")

    @classmethod
    def for_model(cls, name: str, **overrides: Any) -> Setup:
        """The defaults of ``models.MODELS[name]``; ``overrides`` replace config fields (``steps``, ``batch``,
        ``seq_len``, ``learning_rate``, ``seed``, ...) or setup fields (``warmup_steps``, ``eval_every``, ...).
        The default warm-up is the model's, capped at a tenth of the steps."""
        if name not in models.MODELS:
            raise ValueError(f"model must be one of {tuple(models.MODELS)}, got {name!r}")
        preset = models.MODELS[name]
        config_fields = {f.name for f in dataclasses.fields(tiny_llama.Config)}
        config = dataclasses.replace(preset.config, **{k: v for k, v in overrides.items() if k in config_fields})
        setup = {"warmup_steps": min(preset.warmup_steps, config.steps // 10), "eval_every": preset.eval_every,
                 "eval_batches": preset.eval_batches}
        setup.update({k: v for k, v in overrides.items() if k not in config_fields})
        return cls(name, config, **setup)

    def learning_rate(self, step: jax.Array) -> jax.Array:
        """Linear warm-up to the peak over ``warmup_steps``, then cosine decay to ``final_lr_fraction`` of it at
        the last step."""
        peak, steps, warmup = self.config.learning_rate, self.config.steps, self.warmup_steps
        step = jnp.asarray(step, jnp.float32)
        warm = peak * (step + 1) / max(warmup, 1)
        progress = jnp.clip((step - warmup) / max(steps - 1 - warmup, 1), 0.0, 1.0)
        floor = self.final_lr_fraction * peak
        cosine = floor + (peak - floor) * 0.5 * (1 + jnp.cos(jnp.pi * progress))
        return jnp.where(step < warmup, warm, cosine)

    def to_json(self) -> dict:
        rest = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("model", "config")}
        return {"model": self.model, "config": dataclasses.asdict(self.config), **rest}


@dataclasses.dataclass(frozen=True)
class Data:
    """A corpus split for a setup: the training part and the fixed held-out batches."""

    corpus: dict  # name, sha256, token counts, epoch fraction
    train: text_data.TokenCorpus
    held_out: list[np.ndarray]


def bundled_sample() -> Path:
    """The real-text sample shipped with the package (the Python 3.11 tutorial's sources, 256 KB, PSF license;
    jax_aiter/examples/text_sample), the default corpus of ``cpu-tiny``."""
    path = Path(__file__).resolve().parent / "text_sample" / "python-3.11-tutorial.txt"
    if not path.is_file():
        raise FileNotFoundError(f"the bundled text sample ({path}) is missing from this installation: reinstall "
                                "jax-aiter or pass a corpus with --data")
    return path


def load_data(setup: Setup, path: str | Path, *, kind: str = "auto", vocab_size: int | None = None
              ) -> tuple[Setup, Data]:
    """Open and split the corpus at ``path`` for ``setup`` (``kind`` and ``vocab_size`` as in
    ``text_data.open_corpus``). The model's vocabulary becomes the corpus's, rounded up to a multiple of 64 (what an
    MXFP4 LM head or embedding needs); the returned setup carries it. Raises ValueError when the steps would draw
    more than one epoch of the training split."""
    corpus = text_data.open_corpus(path, kind=kind, vocab_size=vocab_size)
    vocab = -(-corpus.vocab_size // 64) * 64
    setup = dataclasses.replace(setup, config=dataclasses.replace(setup.config, vocab=vocab))
    cfg = setup.config
    train, held_out = text_data.split(corpus, held_out_fraction=setup.held_out_fraction)
    epochs = text_data.epoch_fraction(train, cfg.steps, cfg.batch, cfg.seq_len)
    if epochs > 1:
        raise ValueError(f"{cfg.steps} steps of batch {cfg.batch} x {cfg.seq_len} tokens draw {epochs:.2f} epochs of "
                         f"the training split of {corpus.name} ({len(train)} tokens); the benchmark stays under one: "
                         "fewer steps or a larger corpus")
    info = {"name": corpus.name, "sha256": corpus.sha256, "tokens": len(corpus), "vocab_size": corpus.vocab_size,
            "train_tokens": len(train), "held_out_tokens": len(held_out), "epoch_fraction": epochs}
    batches = text_data.held_out_batches(held_out, setup.eval_batches, cfg.batch, cfg.seq_len)
    return setup, Data(info, train, batches)


# --- training ------------------------------------------------------------------------------------------------


def _text_loss(params, tokens, cfg, policy, key):
    logits = tiny_llama.forward(params, tokens[:, :-1], cfg, policy, key=key)
    return jnp.mean(tiny_llama.cross_entropy(logits, tokens[:, 1:]))


def _eval_loss(params, tokens, *, cfg, policy):
    return _text_loss(params, tokens, cfg, policy, jax.random.key(0))


def _clip_by_global_norm(grads, max_norm: float):
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    factor = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: g * factor, grads)


def make_step(setup: Setup, policy: PrecisionPolicy, sr_key: jax.Array):
    """One training step ``(params, opt_state, tokens) -> (params, opt_state, loss)``: loss and gradients under
    ``policy``, global-norm clipping, Adam at the schedule's rate; stochastic rounding at step t uses
    ``fold_in(sr_key, t)``."""
    cfg = setup.config

    def step(params, opt_state, tokens):
        t = opt_state["t"]
        key = jax.random.fold_in(sr_key, t)
        loss, grads = jax.value_and_grad(_text_loss)(params, tokens, cfg, policy, key)
        grads = _clip_by_global_norm(grads, setup.clip_norm)
        params, opt_state = tiny_llama.adam_update(params, grads, opt_state, setup.learning_rate(t))
        return params, opt_state, loss

    return step


def _sha256(arrays) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def train_arm(setup: Setup, data: Data, name: str, arm: Arm, *,
              on_step: Callable[[int, float, float | None, float], None] | None = None,
              log: MlperfLog | None = None) -> dict:
    """Train one arm and return its record: curves, step time and the hashes of its initial weights
    (``init_sha256``) and of the batches it trained on in order (``data_sha256``).

    ``on_step(step, train_loss, held_out_loss or None, step_seconds)`` is called after every step.
    """
    cfg, policy = setup.config, arm.policy
    base_key = jax.random.key(cfg.seed)
    params = tiny_llama.init_params(cfg, base_key)
    init_sha256 = _sha256(jax.tree.leaves(jax.device_get(params)))
    opt_state = tiny_llama.adam_init(params)
    final_from = arm.final_from(cfg.steps)
    phases = arm.schedule.policies
    step_fns = [jax.jit(make_step(setup, p, jax.random.fold_in(base_key, 1)), donate_argnums=(0, 1)) for p in phases]
    eval_fns = [jax.jit(functools.partial(_eval_loss, cfg=cfg, policy=p)) for p in phases]
    held_out = [jnp.asarray(b) for b in data.held_out]

    def evaluate(step: int) -> float:
        if log:
            log.start("eval_start", step)
        eval_fn = eval_fns[int(step > final_from)]  # the policy of the step just trained
        value = statistics.fmean(float(eval_fn(params, b)) for b in held_out)
        if log:
            log.end("eval_stop", step)
            log.event("eval_accuracy", value, step)
        eval_steps.append(step)
        held_out_loss.append(value)
        return value

    if log:
        log.setup(setup, name, policy)
        log.start("run_start", 0)
    train_loss, seconds, eval_steps, held_out_loss = [], [], [], []
    data_digest = hashlib.sha256()
    start = time.perf_counter()
    evaluate(0)
    batches = text_data.train_batches(data.train, cfg.batch, cfg.seq_len, cfg.seed)
    for step, batch in enumerate(itertools.islice(batches, cfg.steps)):
        data_digest.update(np.ascontiguousarray(batch).tobytes())
        if log and step == final_from:
            log.event("precision_policy", _policy_json(arm.final_policy), step)
        t0 = time.perf_counter()
        params, opt_state, loss = step_fns[int(step >= final_from)](params, opt_state, jnp.asarray(batch))
        train_loss.append(float(loss))  # waits for the step: the time below is the step's
        seconds.append(time.perf_counter() - t0)
        done = step + 1
        held = evaluate(done) if done % setup.eval_every == 0 or done == cfg.steps else None
        if on_step is not None:
            on_step(step, train_loss[-1], held, seconds[-1])
    if log:
        log.end("run_stop", cfg.steps, status="success" if math.isfinite(held_out_loss[-1]) else "aborted")
    return {
        "description": arm.description,
        "policy": _policy_json(policy),
        **({} if arm.final_policy is None else
           {"final_policy": _policy_json(arm.final_policy), "final_from_step": final_from}),
        "train_loss": train_loss,
        "eval_steps": eval_steps,
        "held_out_loss": held_out_loss,
        # The first step of a phase compiles; the median of the others is the step time.
        "step_time_ms": 1e3 * statistics.median(seconds[1:final_from] or seconds[:1]),
        **({} if arm.final_policy is None else
           {"final_step_time_ms": 1e3 * statistics.median(seconds[final_from + 1:] or seconds[final_from:])}),
        "first_step_s": seconds[0],
        "wall_s": time.perf_counter() - start,
        "device": jax.devices()[0].device_kind,
        "init_sha256": init_sha256,
        "data_sha256": data_digest.hexdigest(),
        "held_out_sha256": _sha256(data.held_out),
    }


def _policy_json(policy: PrecisionPolicy) -> dict:
    def recipe(r):
        return None if r is None else {"type": type(r).__name__, **dataclasses.asdict(r)}

    return {"linear": recipe(policy.linear), "lm_head": recipe(policy.lm_head),
            "embedding": recipe(policy.embedding), "bf16_first_blocks": policy.bf16_first_blocks,
            "bf16_last_blocks": policy.bf16_last_blocks, "bf16_last_fraction": policy.bf16_last_fraction}


def lower_step(setup: Setup, policy: PrecisionPolicy) -> jax.stages.Lowered:
    """The training step of ``setup``'s model lowered for abstract parameters and batch (nothing allocated): what
    a shape too large to train here (``llama3.1-8b``) is checked with."""
    cfg = setup.config
    params = jax.eval_shape(functools.partial(tiny_llama.init_params, cfg), jax.random.key(0))
    opt_state = jax.eval_shape(tiny_llama.adam_init, params)
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len + 1), jnp.int32)
    return jax.jit(make_step(setup, policy, jax.random.key(0))).lower(params, opt_state, tokens)


# --- results -------------------------------------------------------------------------------------------------


class SetupMismatch(ValueError):
    """Arms that cannot be compared: a different setup, corpus, initial weights or data order."""


def load_results(out_dir: Path) -> dict | None:
    path = Path(out_dir) / "convergence.json"
    return json.loads(path.read_text()) if path.exists() else None


def merge(results: dict | None, setup: Setup, corpus: dict, name: str | None = None, arm: dict | None = None
          ) -> dict:
    """``results`` (a loaded convergence.json, or None) with ``arm`` added as ``name`` (replacing an arm of that
    name). Raises :class:`SetupMismatch` when the setup or corpus differ, or when the arm's initial weights,
    data order or held-out batches differ from the other arms'."""
    header = {"setup": setup.to_json(), "corpus": corpus}
    if results is None:
        results = {**header, "arms": {}}
    for key, value in header.items():
        if results[key] != value:
            differs = sorted(k for k in set(value) | set(results[key]) if results[key].get(k) != value.get(k))
            raise SetupMismatch(f"the existing results have a different {key} (differs in: {', '.join(differs)}); "
                                "write to another --out")
    if arm is None:
        return results
    for other_name, other in results["arms"].items():
        for field in ("init_sha256", "data_sha256", "held_out_sha256"):
            if other_name != name and other[field] != arm[field]:
                raise SetupMismatch(f"arm {name!r} has a different {field} than arm {other_name!r}: the arms did "
                                    "not start from the same weights or see the same data")
    return {**results, "arms": {**results["arms"], name: arm}}


def merge_directory(results: dict, setup: Setup, corpus: dict, source: Path) -> tuple[dict, list[str]]:
    """``results`` (for ``setup`` and ``corpus``) with the arms of the results directory ``source`` that it does
    not already hold as they are there added, as :func:`merge` adds a trained arm, and the names added. For arms
    trained elsewhere: by parallel processes, each into a directory of its own, or on another machine
    (:func:`copy_mllogs` brings their MLPerf logs).
    Raises :class:`SetupMismatch` as :func:`merge` does, and FileNotFoundError without results."""
    other = load_results(source)
    if other is None:
        raise FileNotFoundError(f"{source} holds no convergence.json")
    try:
        merge(other, setup, corpus)
    except SetupMismatch as err:
        raise SetupMismatch(f"{source}: {err}") from None
    # Arms equal to those already in results (a job's copy of the directory it trained into) are not news.
    added = [name for name, arm in other["arms"].items() if results["arms"].get(name) != arm]
    for name in added:
        results = merge(results, setup, corpus, name, other["arms"][name])
    return results, added


def copy_mllogs(source: Path, out_dir: Path, arms: list[str]) -> None:
    """The MLPerf logs of ``arms`` in ``source/mllog`` (those it has) into ``out_dir/mllog``."""
    for name in arms:
        log = Path(source) / "mllog" / f"{name}.log"
        if log.exists():
            (Path(out_dir) / "mllog").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, Path(out_dir) / "mllog" / log.name)


def _final_held_out(arm: dict) -> float:
    trained = [loss for step, loss in zip(arm["eval_steps"], arm["held_out_loss"], strict=True) if step > 0]
    return statistics.fmean(trained[-FINAL_EVALS:])


def _final_train(arm: dict) -> float:
    losses = arm["train_loss"]
    return statistics.fmean(losses[-max(1, round(FINAL_TRAIN_FRACTION * len(losses))):])


def gaps(results: dict) -> dict[str, dict]:
    """Per arm: final held-out and train loss and, when the reference arm is present, the held-out and train
    gaps ``(arm - bf16) / bf16`` and the step-time ratio to BF16 (None without the reference)."""
    arms = results["arms"]
    reference = arms.get(REFERENCE)
    table = {}
    for name, arm in arms.items():
        row = {"held_out": _final_held_out(arm), "train": _final_train(arm), "step_time_ms": arm["step_time_ms"],
               "held_out_gap": None, "train_gap": None, "step_time_ratio": None}
        if reference is not None:
            ref_held, ref_train = _final_held_out(reference), _final_train(reference)
            row.update(held_out_gap=(row["held_out"] - ref_held) / ref_held,
                       train_gap=(row["train"] - ref_train) / ref_train,
                       step_time_ratio=arm["step_time_ms"] / reference["step_time_ms"])
        table[name] = row
    return table


GAP_DEFINITION = (f"gap = (loss_arm - loss_bf16) / loss_bf16; held-out: mean of the last {FINAL_EVALS} held-out "
                  "evaluations (the last at the final step; the one before training never counts); train: mean "
                  f"training loss over the last {FINAL_TRAIN_FRACTION:.0%} of the steps")


def seed_directory(seed: int) -> str:
    """The directory, under ``--out``, of one seed's results when several seeds are trained."""
    return f"seed-{seed}"


SEED_SUMMARY_DEFINITION = ("over seeds: each seed trains its arms from its own weights and data order, and each "
                           "arm's gap is taken to the BF16 arm of the same seed (paired); per arm, over the seeds "
                           "that trained it (two or more): mean, sample standard deviation, standard error of the "
                           "mean (std / sqrt(seeds)), smallest and largest gap")


def seed_tables(out_dir: Path, setup: Setup, corpus: dict) -> dict[int, dict[str, dict]]:
    """The :func:`gaps` table of every seed directory under ``out_dir`` (``seed-<S>/convergence.json``, written by
    this call or an earlier one), by seed. Raises :class:`SetupMismatch` when a directory's setup, its seed aside,
    or its corpus differs from ``setup`` and ``corpus``."""
    tables = {}
    for path in sorted(Path(out_dir).glob("seed-*/convergence.json")):
        seed_text = path.parent.name.removeprefix("seed-")
        if not seed_text.isdigit() or path.parent.name != seed_directory(int(seed_text)):
            continue  # not a directory seed_directory names (seed-01, seed-x)
        seeded = dataclasses.replace(setup, config=dataclasses.replace(setup.config, seed=int(seed_text)))
        try:
            tables[int(seed_text)] = gaps(merge(load_results(path.parent), seeded, corpus))
        except SetupMismatch as err:
            raise SetupMismatch(f"{path.parent.name}: {err}") from None
    return dict(sorted(tables.items()))


def seed_summary(tables: dict[int, dict[str, dict]], paired_to: str | None = None) -> dict:
    """The paired gaps of several seeds. ``tables`` maps each seed to its :func:`gaps` table; every arm with a gap
    in two seeds or more is summarized over those seeds (``seeds``; held-out and train gap: per-seed values, mean,
    sample std, standard error, min, max; the mean step-time ratio). Needs two seeds or more.

    With ``paired_to`` (an arm's name), every other arm but BF16 that shares two seeds or more with it also gets
    ``paired``: its held-out gap minus that arm's, seed by seed over the shared seeds, with their mean and
    standard error. Two policies are compared this way: the seed's own spread cancels in the difference."""
    if len(tables) < 2:
        raise ValueError(f"a summary over seeds needs at least two seeds, got {len(tables)}")
    if paired_to is not None and not any(paired_to in table for table in tables.values()):
        raise ValueError(f"paired_to: no seed has the arm {paired_to!r}")
    seeds = list(tables)
    arms = {}
    for name in dict.fromkeys(name for seed in seeds for name in tables[seed]):
        trained = [s for s in seeds if tables[s].get(name, {}).get("held_out_gap") is not None]
        if len(trained) < 2:
            continue
        row = {"seeds": trained}
        for kind in ("held_out_gap", "train_gap"):
            values = [tables[s][name][kind] for s in trained]
            std = statistics.stdev(values)
            row.update({f"{kind}_per_seed": values, f"{kind}_mean": statistics.fmean(values), f"{kind}_std": std,
                        f"{kind}_stderr": std / math.sqrt(len(values)), f"{kind}_min": min(values),
                        f"{kind}_max": max(values)})
        row["step_time_ratio_mean"] = statistics.fmean(tables[s][name]["step_time_ratio"] for s in trained)
        arms[name] = row
    summary = {"seeds": seeds, "definition": SEED_SUMMARY_DEFINITION, "gap_definition": GAP_DEFINITION,
               "directories": [seed_directory(s) for s in seeds], "arms": arms}
    if paired_to is None:
        return summary
    for name, row in arms.items():
        shared = [s for s in row["seeds"] if tables[s].get(paired_to, {}).get("held_out_gap") is not None]
        if name in (paired_to, REFERENCE) or len(shared) < 2:
            continue
        differences = [tables[s][name]["held_out_gap"] - tables[s][paired_to]["held_out_gap"] for s in shared]
        row["paired"] = {"to": paired_to, "seeds": shared, "held_out_gap_difference_per_seed": differences,
                         "held_out_gap_difference_mean": statistics.fmean(differences),
                         "held_out_gap_difference_stderr": statistics.stdev(differences) / math.sqrt(len(shared))}
    return {**summary, "paired_to": paired_to}


def save_seed_summary(summary: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / "seeds.json"
    path.write_text(json.dumps(summary, indent=1, allow_nan=True))
    return path


def save(results: dict, out_dir: Path) -> list[Path]:
    """Write ``convergence.json`` (with the gaps) and, when matplotlib is installed, ``convergence.png``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {**results, "gap_definition": GAP_DEFINITION, "summary": gaps(results)}
    written = [out_dir / "convergence.json"]
    written[0].write_text(json.dumps(results, indent=1, allow_nan=True))
    if not results["arms"]:
        return written
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return written  # the plot is optional; the JSON holds every number
    fig, (held_ax, train_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (name, arm) in enumerate(results["arms"].items()):
        row = results["summary"][name]
        gap = "" if row["held_out_gap"] is None else f", {100 * row['held_out_gap']:+.2f} %"
        color = plt.cm.tab20(i % 20)
        held_ax.plot(arm["eval_steps"], arm["held_out_loss"], marker=".", linewidth=1, color=color,
                     label=f"{name} ({row['held_out']:.4f}{gap})")
        window = max(1, len(arm["train_loss"]) // 50)
        smooth = np.convolve(arm["train_loss"], np.ones(window) / window, mode="valid")
        train_ax.plot(np.arange(window, len(arm["train_loss"]) + 1), smooth, linewidth=1, color=color, label=name)
    setup = results["setup"]
    for ax, what in ((held_ax, "held-out loss"), (train_ax, "training loss (moving mean)")):
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(f"{what}, nats/token")
        ax.legend(fontsize=8)
    held_ax.set_title(f"{setup['model']} on {results['corpus']['name']}: held-out loss (gap vs BF16)")
    train_ax.set_title("training loss")
    fig.tight_layout()
    fig.savefig(out_dir / "convergence.png", dpi=120)
    plt.close(fig)
    written.append(out_dir / "convergence.png")
    return written


# --- MLPerf-format log -------------------------------------------------------------------------------------


class MlperfLog:
    """One arm's MLPerf-format log (``:::MLLOG {json}`` lines) written through ``mlperf_logging.mllog`` into its
    own file; events carry the step as ``metadata.step`` and the samples seen as ``metadata.samples_count``."""

    def __init__(self, path: Path, mllog) -> None:
        self._constants = mllog.constants
        self._logger = logging.getLogger(f"jax_aiter.convergence.mllog.{path}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(path, mode="w")
        self._logger.addHandler(self._handler)
        self._mllog = mllog.mllog.MLLogger(logger=self._logger, default_stack_offset=2)
        self._samples_per_step = 1

    def _metadata(self, step: int, extra: dict | None = None) -> dict:
        return {"step": step, "samples_count": step * self._samples_per_step, **(extra or {})}

    def setup(self, setup: Setup, arm: str, policy: PrecisionPolicy) -> None:
        c, cfg = self._constants, setup.config
        self._samples_per_step = cfg.batch
        self._mllog.event(key=c.CACHE_CLEAR, value=True)
        self._mllog.start(key=c.INIT_START)
        for key, value in ((c.SUBMISSION_BENCHMARK, f"jax-aiter-convergence-{setup.model}"),
                           ("precision_arm", arm), ("precision_policy", _policy_json(policy)),
                           (c.SEED, cfg.seed), (c.GLOBAL_BATCH_SIZE, cfg.batch),
                           (c.MAX_SEQUENCE_LENGTH, cfg.seq_len), (c.MAX_STEPS, cfg.steps), (c.OPT_NAME, c.ADAM),
                           (c.OPT_BASE_LR, cfg.learning_rate),
                           (c.OPT_END_LR, cfg.learning_rate * setup.final_lr_fraction),
                           (c.OPT_LR_WARMUP_STEPS, setup.warmup_steps),
                           (c.OPT_GRADIENT_CLIP_NORM, setup.clip_norm),
                           (c.EVAL_SAMPLES, setup.eval_batches * cfg.batch)):
            self._mllog.event(key=key, value=value)
        self._mllog.end(key=c.INIT_STOP)

    def start(self, key: str, step: int) -> None:
        self._mllog.start(key=key, metadata=self._metadata(step))

    def end(self, key: str, step: int, **extra: Any) -> None:
        self._mllog.end(key=key, metadata=self._metadata(step, extra))
        if key == self._constants.RUN_STOP:
            self._logger.removeHandler(self._handler)
            self._handler.close()

    def event(self, key: str, value: Any, step: int) -> None:
        self._mllog.event(key=key, value=value, metadata=self._metadata(step))


def open_mllog(out_dir: Path, arm: str) -> MlperfLog | None:
    """The arm's MLPerf log at ``out_dir/mllog/<arm>.log``, or None when ``mlperf-logging`` is not installed."""
    try:
        from mlperf_logging import mllog
        from mlperf_logging.mllog import constants  # noqa: F401  (mllog.constants, imported as a submodule)
    except ModuleNotFoundError:
        return None
    folder = Path(out_dir) / "mllog"
    folder.mkdir(parents=True, exist_ok=True)
    return MlperfLog(folder / f"{arm}.log", mllog)
