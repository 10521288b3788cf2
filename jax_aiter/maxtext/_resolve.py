"""Recipe resolution: the MaxText arguments, XLA flags and environment of a recipe run, from the recipe, the mode
and the run's options, without importing jax or MaxText (``jax-aiter recipe ... --dry-run`` prints them on a
machine without accelerators, or without MaxText).

A recipe fixes a model and its training setup as MaxText ``key=value`` overrides of MaxText's ``base.yml``; the
mode picks the precision policy (``jax_aiter.precision``) of the block projections. Attention is
``attention=jax_aiter`` in every mode.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from jax_aiter._phases import closing_phase_start

__all__ = ["ATTENTION_KERNEL", "MODES", "RECIPES", "TESTED_MAXTEXT_VERSIONS", "RecipeRun", "TrainingRecipe",
           "resolve"]

TESTED_MAXTEXT_VERSIONS = ("0.2.5",)
# The value of MaxText's `attention` key that jax_aiter.maxtext.enable routes to flash_attn_func (MaxText itself
# has no kernel of that name).
ATTENTION_KERNEL = "jax_aiter"


class Mode(NamedTuple):
    """A recipe mode: the ``PrecisionPolicy`` constructor the run uses and its keyword arguments, what it does, and
    MLPerf's name of the lowest precision in the linear layers. Plain data: this module imports no jax."""

    constructor: str
    description: str
    mlperf_precision: str
    arguments: dict


MODES = {
    "mxfp4": Mode("mxfp4", "PrecisionPolicy.mxfp4(bf16_last_fraction=0): every block projection through "
                  "gemm_fp4_bf16 with Mxfp4Recipe.keyed_hadamard() (MXFP4 fprop, dgrad and wgrad; paired 16-point "
                  "Hadamard with keyed signs on wgrad); MaxText's layers carry no index, so no block stays BF16",
                  "mxfp4", {"bf16_last_fraction": 0.0}),
    "fp8": Mode("fp8", "PrecisionPolicy.fp8(): block projections through gemm_fp8 with Fp8Recipe.default() "
                "(per-tensor current scaling, E4M3 forward, E5M2 gradients)", "fp8", {}),
    "bf16": Mode("bf16", "PrecisionPolicy.bf16(): block projections are MaxText's own BF16 dot_general", "bfloat16",
                 {}),
}
_HEAD = "LM head (logits_dense) and token embedding: MaxText's own BF16 in every mode"

# MLPerf Training's llama31_8b reference point for a global batch of 32 (mlperf-logging's RCP file
# rcps_llama31_8b.json, entry llama31_8b_ref_32): peak learning rate 8e-4 after 4096 warmup samples. The
# closed-division rules (compliance_checker training_6.0.0/closed_llama31_8b.yaml) fix AdamW with beta1 0.9,
# beta2 0.95, epsilon 1e-5, weight decay 0.1, clipping at 1.0, a cosine schedule with linear warmup over
# 1,200,000 samples, 1024 evaluation samples and a target evaluation log-perplexity of 3.3.
_LLAMA_GLOBAL_BATCH = 32
_LLAMA_SCHEDULE_STEPS = 1_200_000 // _LLAMA_GLOBAL_BATCH
_LLAMA_WARMUP_STEPS = 4096 // _LLAMA_GLOBAL_BATCH


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
    """A model and its training setup: MaxText overrides, device count and XLA flags."""

    name: str
    summary: str
    hardware: str
    devices: int
    per_device_batch: int
    seq_len: int
    default_steps: int
    maxtext: tuple[tuple[str, str], ...]
    xla_flags: tuple[str, ...]
    # Evaluation (on the held-out data, or on the synthetic batch): steps per evaluation, train steps between.
    eval_steps: int
    eval_interval: int


def _common(recipe_devices: int, per_device_batch: int, seq_len: int) -> tuple[tuple[str, str], ...]:
    return (
        ("ici_fsdp_parallelism", str(recipe_devices)),
        ("shardy", "true"),
        ("per_device_batch_size", str(per_device_batch)),
        ("max_target_length", str(seq_len)),
        ("dtype", "bfloat16"),
        ("weight_dtype", "float32"),
        ("grad_dtype", "float32"),
        ("mu_dtype", "float32"),
        ("attention", ATTENTION_KERNEL),
        ("quantization", ""),
        ("packing", "false"),
        ("enable_checkpointing", "false"),
        ("enable_tensorboard", "false"),
        # No persistent compilation cache (MaxText's default is ~/jax_cache): a run compiles what it runs.
        ("jax_cache_dir", ""),
        ("skip_jax_distributed_system", "true"),
        ("opt_type", "adamw"),
        ("adam_b1", "0.9"),
        ("adam_b2", "0.95"),
        ("adam_eps", "1e-05"),
        ("adam_weight_decay", "0.1"),
        ("gradient_clipping_threshold", "1.0"),
        ("lr_schedule_type", "cosine"),
        ("init_weights_seed", "0"),
        ("data_shuffle_seed", "0"),
    )


def _small_llama(hardware: str, devices: int, per_device_batch: int, seq_len: int, *, width: int, heads: int,
                 kv_heads: int, mlp: int, layers: int, vocab: int, learning_rate: str, log_period: int
                 ) -> tuple[tuple[str, str], ...]:
    """The MaxText overrides of a small Llama-style test decoder (decoder_block=llama2, heads of 64, no dropout,
    full remat, 10 % warm-up, cosine to a tenth of the peak learning rate)."""
    return (
        ("decoder_block", "llama2"),
        ("hardware", hardware),
        ("base_emb_dim", str(width)),
        ("base_num_query_heads", str(heads)),
        ("base_num_kv_heads", str(kv_heads)),
        ("head_dim", "64"),
        ("base_mlp_dim", str(mlp)),
        ("base_num_decoder_layers", str(layers)),
        ("vocab_size", str(vocab)),
        ("enable_dropout", "false"),
        *_common(devices, per_device_batch, seq_len),
        ("remat_policy", "full"),
        ("learning_rate", learning_rate),
        ("warmup_steps_fraction", "0.1"),
        ("learning_rate_final_fraction", "0.1"),
        ("log_period", str(log_period)),
    )


RECIPES = {
    "llama3.1-8b": TrainingRecipe(
        name="llama3.1-8b",
        summary="Llama 3.1 8B (MaxText model_name=llama3.1-8b), one node of 8 GPUs",
        hardware="gpu", devices=8, per_device_batch=4, seq_len=8192, default_steps=_LLAMA_SCHEDULE_STEPS,
        maxtext=(
            ("model_name", "llama3.1-8b"),
            ("hardware", "gpu"),
            *_common(8, 4, 8192),
            ("remat_policy", "full"),
            ("learning_rate", "0.0008"),
            ("learning_rate_schedule_steps", str(_LLAMA_SCHEDULE_STEPS)),
            ("warmup_steps_fraction", repr(_LLAMA_WARMUP_STEPS / _LLAMA_SCHEDULE_STEPS)),
            ("learning_rate_final_fraction", "0.1"),
            ("target_eval_loss", "3.3"),
            ("log_period", "100"),
        ),
        xla_flags=("--xla_gpu_enable_latency_hiding_scheduler=true",),
        eval_steps=1024 // _LLAMA_GLOBAL_BATCH, eval_interval=12_288 // _LLAMA_GLOBAL_BATCH,
    ),
    "cpu-tiny": TrainingRecipe(
        name="cpu-tiny",
        summary="a 2-layer Llama-style decoder (MaxText decoder_block=llama2, width 256) on 8 virtual CPU devices",
        hardware="cpu", devices=8, per_device_batch=1, seq_len=64, default_steps=12,
        maxtext=_small_llama("cpu", 8, 1, 64, width=256, heads=4, kv_heads=2, mlp=512, layers=2, vocab=384,
                             learning_rate="0.003", log_period=1),
        xla_flags=("--xla_force_host_platform_device_count=8",),
        eval_steps=1, eval_interval=4,
    ),
    # A smoke run of every mode on one GPU: the same integration, runner, remat and MLPerf log as llama3.1-8b,
    # on a model that compiles and trains in minutes. Synthetic tokens are uniform over the vocabulary, so the
    # first loss is near ln(32000) = 10.4.
    "gpu-small": TrainingRecipe(
        name="gpu-small",
        summary="a 4-layer Llama-style decoder (MaxText decoder_block=llama2, width 512) on one GPU",
        hardware="gpu", devices=1, per_device_batch=8, seq_len=1024, default_steps=60,
        maxtext=_small_llama("gpu", 1, 8, 1024, width=512, heads=8, kv_heads=4, mlp=1536, layers=4, vocab=32000,
                             learning_rate="0.001", log_period=10),
        # One device: no collectives to schedule around, and no virtual host devices.
        xla_flags=(),
        eval_steps=4, eval_interval=20,
    ),
}


def maxtext_location() -> tuple[str | None, Path | None]:
    """MaxText's installed version and package folder (None, None when it is not installed), found without
    importing it."""
    spec = importlib.util.find_spec("maxtext")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        version = importlib.metadata.version("maxtext")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return version, Path(next(iter(spec.submodule_search_locations)))


@dataclasses.dataclass(frozen=True)
class RecipeRun:
    """A resolved run: everything the training process is started with."""

    recipe: TrainingRecipe
    mode: str
    out: Path
    steps: int
    data: str | None
    eval_data: str | None
    maxtext_version: str | None
    maxtext_config: Path | None
    overrides: tuple[tuple[str, str], ...]
    xla_flags: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]
    # A closing phase: steps final_from .. steps-1 in final_mode, resumed from the first phase's checkpoint.
    final_mode: str | None = None
    final_fraction: float | None = None
    final_from: int | None = None

    @property
    def policy_constructor(self) -> str:
        return MODES[self.mode].constructor

    @property
    def mlperf_linear_precision(self) -> str:
        return MODES[self.mode].mlperf_precision

    @property
    def phase_modes(self) -> tuple[str, ...]:
        """The mode of each training process in order: one, or two with a closing phase."""
        return (self.mode,) if self.final_mode is None else (self.mode, self.final_mode)

    def override(self, key: str) -> str:
        return dict(self.overrides)[key]

    def phase_overrides(self, phase: int = 0) -> tuple[tuple[str, str], ...]:
        """The MaxText overrides of training process ``phase``: :attr:`overrides`, and with a closing phase the
        first phase's ``steps`` (``final_from``), its checkpoint on completion, and the closing phase's MLPerf log
        of its own (``mllog-closing.txt``)."""
        if not 0 <= phase < len(self.phase_modes):
            raise ValueError(f"phase must be in [0, {len(self.phase_modes)}), got {phase!r}")
        if self.final_mode is None:
            return self.overrides
        merged = dict(self.overrides)
        if phase == 0:
            merged.update(steps=str(self.final_from), save_checkpoint_on_completion="true")
        else:
            merged.update(save_checkpoint_on_completion="false", mllog_file=str(self.out / "mllog-closing.txt"))
        return tuple(merged.items())

    def maxtext_argv(self, phase: int = 0) -> list[str]:
        """MaxText's ``train.main`` argv of training process ``phase``: the program name, base.yml, then the
        ``key=value`` overrides."""
        config = str(self.maxtext_config) if self.maxtext_config else "<maxtext>/configs/base.yml"
        return ["", config, *(f"{key}={value}" for key, value in self.phase_overrides(phase))]

    def banner(self) -> str:
        r = self.recipe
        tested = ("tested" if self.maxtext_version in TESTED_MAXTEXT_VERSIONS else
                  f"NOT tested: jax_aiter.maxtext refuses it; tested: {', '.join(TESTED_MAXTEXT_VERSIONS)}")
        maxtext = (f"{self.maxtext_version} ({tested}) at {self.maxtext_config.parent.parent}"
                   if self.maxtext_config else "not installed (pip install 'jax-aiter[maxtext]')")
        global_batch = r.devices * r.per_device_batch
        data = (f"Megatron indexed datasets (grain_file_type=mmap): train {self.data}, held-out {self.eval_data}"
                if self.data else
                "synthetic (MaxText dataset_type=synthetic: one fixed batch of random tokens)")
        lines = [
            f"jax-aiter recipe {r.name} --mode {self.mode}" + ("" if self.final_mode is None else
                                                                f" --final-mode {self.final_mode} --final-fraction "
                                                                f"{self.final_fraction:g}"),
            f"  model        {r.summary}",
            f"  projections  {MODES[self.mode].description}",
            f"               {_HEAD}",
            f"  attention    attention={ATTENTION_KERNEL}: jax_aiter.mha.flash_attn_func, causal over each row "
            "(cuDNN on NVIDIA, AITER on ROCm, the reference on the CPU)",
            f"  parallelism  {r.devices} {r.hardware.upper()} device{'s' if r.devices > 1 else ''}, "
            f"FSDP {r.devices} (ici_fsdp_parallelism={r.devices}), Shardy partitioner (shardy=true)",
            f"  batch        per device {r.per_device_batch}, global {global_batch} sequences of {r.seq_len} tokens",
            "  dtypes       compute bfloat16, weights float32, gradients float32, AdamW moments float32",
            f"  data         {data}",
            f"  steps        {self.steps}" + ("" if self.final_mode is None else
                                              f" (steps 0-{self.final_from - 1} in mode {self.mode}, then a "
                                              "closing phase)"),
            *(() if self.final_mode is None else (
                f"  closing      steps {self.final_from}-{self.steps - 1}: mode {self.final_mode}, "
                f"{MODES[self.final_mode].description}",
                f"               a second training process resumes from the first one's checkpoint (step "
                f"{self.final_from - 1}) in {self.override('base_output_directory')}")),
            f"  MaxText      {maxtext}",
            f"  output       {self.out}",
            "MaxText arguments (maxtext.trainers.pre_train.train.main argv):",
            *(f"  {arg}" for arg in self.maxtext_argv()[1:]),
            *(() if self.final_mode is None else (
                "MaxText arguments of the closing phase, where they differ:",
                *(f"  {key}={value}" for key, value in self.phase_overrides(1)
                  if dict(self.phase_overrides(0)).get(key) != value))),
            "XLA flags:",
            f"  XLA_FLAGS={' '.join(self.xla_flags)}",
            "environment:",
            *(f"  {key}={value}" for key, value in self.environment),
        ]
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict:
        return {"recipe": self.recipe.name, "mode": self.mode, "final_mode": self.final_mode,
                "final_fraction": self.final_fraction, "final_from": self.final_from, "out": str(self.out),
                "steps": self.steps, "data": self.data, "eval_data": self.eval_data,
                "maxtext_version": self.maxtext_version,
                "phases": [{"mode": mode, "policy": MODES[mode].constructor, "maxtext_argv": self.maxtext_argv(i)}
                           for i, mode in enumerate(self.phase_modes)],
                "xla_flags": list(self.xla_flags), "environment": dict(self.environment)}


def _parse_overrides(extra: Sequence[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected MaxText's key=value")
        pairs.append((key, value))
    return tuple(pairs)


def resolve(recipe: str, mode: str, out: str | Path, *, steps: int | None = None, data: str | None = None,
            eval_data: str | None = None, eod_id: int | None = None, dump_hlo: bool = False,
            overrides: Sequence[str] = (), environ_xla_flags: str = "", final_mode: str | None = None,
            final_fraction: float | None = None) -> RecipeRun:
    """The run of ``recipe`` in ``mode`` writing to ``out``.

    ``data`` / ``eval_data``: the training and held-out Megatron indexed datasets (``.bin``/``.idx`` prefixes),
    read by MaxText's Grain mmap pipeline, with ``eod_id`` the end-of-document token of their preprocessing;
    without them the run trains and evaluates on MaxText's synthetic batch. ``dump_hlo`` adds XLA flags that dump the
    training step's HLO to ``out/hlo``. ``overrides`` (MaxText ``key=value``) come last and win.
    ``environ_xla_flags`` (the caller's XLA_FLAGS) are kept, before the recipe's.

    ``final_mode`` / ``final_fraction``: a closing phase, as ``jax_aiter.precision.PrecisionSchedule`` defines
    it: the last ``round(steps * final_fraction)`` steps train in ``final_mode``. MaxText cannot switch a
    compiled step's precision, so the run is two training processes in one MaxText run directory: the first
    trains to the closing phase and saves a checkpoint (synchronously, on completion only), the second restores
    it (weights, optimizer state, data iterator) and trains the rest. The learning-rate schedule spans all the
    steps in both (``learning_rate_schedule_steps``).
    """
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {sorted(RECIPES)}, got {recipe!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if final_mode is None:
        if final_fraction is not None:
            raise ValueError("final_fraction: a closing phase needs final_mode too")
    else:
        if final_mode not in MODES:
            raise ValueError(f"final_mode must be one of {list(MODES)}, got {final_mode!r}")
        if (isinstance(final_fraction, bool) or not isinstance(final_fraction, (int, float))
                or not 0 < final_fraction < 1):
            raise ValueError(f"final_fraction must be a number in (0, 1) with final_mode, got {final_fraction!r}")
    r = RECIPES[recipe]
    steps = r.default_steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if (data is None) != (eval_data is None):
        raise ValueError("data and eval_data go together: the training and the held-out Megatron datasets")
    if data is not None and (isinstance(eod_id, bool) or not isinstance(eod_id, int) or eod_id < 0):
        raise ValueError(f"eod_id: the data's end-of-document token id (a non-negative int) is required with "
                         f"data, got {eod_id!r}")
    out = Path(out).absolute()
    version, package = maxtext_location()
    config = package / "configs" / "base.yml" if package else None
    run_name = f"{r.name}-{mode}" if final_mode is None else f"{r.name}-{mode}-then-{final_mode}"
    run = [("run_name", run_name), ("base_output_directory", str(out / "maxtext")),
           ("steps", str(steps)), ("enable_mllog", "true"), ("mllog_file", str(out / "mllog.txt"))]
    if data is None:
        run.append(("dataset_type", "synthetic"))
    else:
        run += [("dataset_type", "grain"), ("grain_file_type", "mmap"), ("grain_train_files", data),
                ("grain_eval_files", eval_data), ("mmap_eod_id", str(eod_id)), ("reset_attention_mask", "false"),
                ("eod_mask_loss", "false")]
    run += [("eval_steps", str(r.eval_steps)), ("eval_interval", str(r.eval_interval))]
    merged = dict(r.maxtext)
    merged.update(run)
    user = _parse_overrides(overrides)
    merged.update(user)
    final_from = None
    if final_mode is not None:
        total = int(merged["steps"])
        final_from = closing_phase_start(total, final_fraction)
        # One checkpoint, written when the first process completes: none at the start, none periodically
        # (no step is a multiple of total + 1), and no background writer that could outlive the process.
        merged.update(enable_checkpointing="true", async_checkpointing="false", save_checkpoint_on_start="false",
                      checkpoint_period=str(total + 1))
        merged.setdefault("learning_rate_schedule_steps", str(total))
        merged.update(user)
    xla_flags = tuple(environ_xla_flags.split()) + r.xla_flags
    if dump_hlo:
        xla_flags += (f"--xla_dump_to={out / 'hlo'}", "--xla_dump_hlo_module_re=jit_train_step")
    # DECOUPLE_GCLOUD: MaxText's switch that replaces its Google Cloud integrations with stubs.
    environment = (("DECOUPLE_GCLOUD", "TRUE"),)
    return RecipeRun(recipe=r, mode=mode, out=out, steps=int(merged["steps"]), data=data, eval_data=eval_data,
                     maxtext_version=version, maxtext_config=config, overrides=tuple(merged.items()),
                     xla_flags=xla_flags, environment=environment, final_mode=final_mode,
                     final_fraction=final_fraction, final_from=final_from)
