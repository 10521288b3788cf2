"""The MLPerf Training log of a recipe run, for the ``llama31_8b`` benchmark.

MaxText writes MLPerf-format logs itself (``enable_mllog=true mllog_file=...``, through the optional
``mlperf-logging`` package): cache clear, init start/stop, run start/stop, blocks, evaluations and their
accuracy (the evaluation loss) come from its training loop. Its static events (``mllog_utils.init_print``) name
another benchmark, organisation and platform, so the runner replaces that one function with
:func:`llama31_8b_init_print`, which logs the same kinds of events for Llama 3.1 8B from the run's own config,
devices and precision policy.

The 6.0.0 rules count the schedule in samples (the closed llama31_8b rules require ``max_steps`` = 1,200,000 and
a decay of 1,200,000 minus the warmup, and the reference point's warmup is 4096 samples), so ``max_steps``,
``opt_learning_rate_warmup_steps`` and ``opt_learning_rate_decay_steps`` are logged as steps times the global
batch.
"""

from __future__ import annotations

import jax
from maxtext.utils import mllog_utils

__all__ = ["install", "llama31_8b_init_print"]

_RUN: dict[str, object] = {}


def llama31_8b_init_print(config) -> None:
    """Replacement of MaxText's ``mllog_utils.init_print``: the submission, hyperparameter and precision events
    of a Llama 3.1 8B run, from ``config`` and the run's mode."""
    mllog_utils.setup_mllog(config)
    # MaxText's own gate (logging configured, mlperf-logging importable, process 0).
    if not mllog_utils._should_log():
        return
    mllog, log = mllog_utils.mllog, mllog_utils.mllogger
    c = mllog.constants
    global_batch = config.global_batch_size_to_train_on
    schedule = config.learning_rate_schedule_steps
    warmup = int(schedule * config.warmup_steps_fraction)
    devices = jax.devices()
    precision = _RUN["linear_precision"]
    events = (
        (c.SUBMISSION_ORG, "jax-aiter recipe (unofficial)"),
        (c.SUBMISSION_PLATFORM, f"{len(devices)}x{devices[0].device_kind}"),
        (c.SUBMISSION_STATUS, c.RESEARCH),
        (c.SUBMISSION_DIVISION, c.CLOSED),
        (c.SUBMISSION_BENCHMARK, c.LLAMA31_8B),
        (c.SEED, config.data_shuffle_seed),
        (c.GLOBAL_BATCH_SIZE, global_batch),
        (c.GRADIENT_ACCUMULATION_STEPS, config.gradient_accumulation_steps),
        (c.MAX_SEQUENCE_LENGTH, config.max_target_length),
        (c.EVAL_SAMPLES, config.global_batch_size_to_eval_on * max(config.eval_steps, 0)),
        (c.TRAIN_SAMPLES, config.steps * global_batch),
        (c.INIT_CHECKPOINT_STEP, 0),
        (c.OPT_NAME, c.ADAMW),
        (c.OPT_BASE_LR, config.learning_rate),
        (c.OPT_END_LR, config.learning_rate * config.learning_rate_final_fraction),
        (c.OPT_LR_WARMUP_STEPS, warmup * global_batch),
        (c.OPT_LR_DECAY_STEPS, (schedule - warmup) * global_batch),
        (c.OPT_LR_DECAY_SCHEDULE, "cosine with linear warmup"),
        (c.MAX_STEPS, schedule * global_batch),
        (c.OPT_ADAMW_BETA_1, config.adam_b1),
        (c.OPT_ADAMW_BETA_2, config.adam_b2),
        (c.OPT_ADAMW_EPSILON, config.adam_eps),
        (c.OPT_ADAMW_WEIGHT_DECAY, config.adam_weight_decay),
        (c.OPT_GRADIENT_CLIP_NORM, config.gradient_clipping_threshold),
        ("target_accuracy", config.target_eval_loss),
        # The FSDP all-gathers move the projections' quantized weight copies (bf16 weights in BF16 mode).
        (c.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, precision),
        (c.LOWEST_NUMERICAL_PRECISION_IN_ATTN, "bfloat16"),
        (c.LOWEST_NUMERICAL_PRECISION_IN_COMM, precision),
        (c.TENSOR_PARALLELISM, config.ici_tensor_parallelism),
        (c.PIPELINE_PARALLELISM, config.ici_pipeline_parallelism),
        (c.CONTEXT_PARALLELISM, config.ici_context_parallelism),
        (c.EXPERT_PARALLELISM, config.ici_expert_parallelism),
        (c.MICRO_BATCH_SIZE, int(config.per_device_batch_size)),
        (c.CONFIG_FILENAME, "resolved.json"),
        ("jax_aiter_precision_policy", _RUN["policy"]),
        ("jax_aiter_attention", "jax_aiter.mha.flash_attn_func"),
    )
    for key, value in events:
        log.event(key, value)


def install(linear_precision: str, policy: str) -> None:
    """Replace MaxText's ``mllog_utils.init_print`` with :func:`llama31_8b_init_print` for this process."""
    _RUN.update(linear_precision=linear_precision, policy=policy)
    mllog_utils.init_print = llama31_8b_init_print
