"""jax_aiter.maxtext: recipe resolution and the dry run (no MaxText needed, no jax imported), the MaxText-side
pieces in process, and (tier `maxtext`: MaxText 0.2.5 and mlperf-logging installed, `pip install
'jax-aiter[maxtext]'`) the cpu-tiny recipe trained by the runner under each mode, with its compiled program and
its MLPerf log inspected."""

import functools
import json
import math
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from jax_aiter.maxtext import MODES, RECIPES, resolve, run

# --- resolution and the dry run (no MaxText, no jax) -------------------------------------------------------

_BANNER_LINES = {
    # mode -> the projections line's mark
    "mxfp4": "gemm_fp4_bf16 with Mxfp4Recipe.keyed_hadamard()",
    "fp8": "gemm_fp8 with Fp8Recipe.default() (per-tensor current scaling",
    "bf16": "block projections are MaxText's own BF16 dot_general",
}


def _dry_run(*args: str) -> str:
    """`jax-aiter recipe ... --dry-run` in a fresh interpreter that then asserts it imported no jax, Flax or
    MaxText module."""
    program = ("import sys; from jax_aiter.cli import main; code = main(sys.argv[1:]); "
               "loaded = [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'maxtext')]; "
               "assert not loaded, loaded; sys.exit(code)")
    # JAX_AITER_BACKEND (CI's forced-reference run sets it) is checked against the op table when jax_aiter is
    # imported, which imports jax: the no-jax promise holds for a process without that override.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_AITER_BACKEND")}
    done = subprocess.run([sys.executable, "-c", program, "recipe", *args, "--dry-run"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


# recipe -> (the parallelism line, the batch line, its model and batch arguments, its XLA_FLAGS line)
_RECIPE_BANNERS = {
    "llama3.1-8b": ("8 GPU devices, FSDP 8 (ici_fsdp_parallelism=8), Shardy partitioner (shardy=true)",
                    "per device 4, global 32 sequences of 8192 tokens",
                    {"model_name": "llama3.1-8b", "hardware": "gpu", "ici_fsdp_parallelism": "8",
                     "per_device_batch_size": "4", "max_target_length": "8192"},
                    "  XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true"),
    "gpu-small": ("1 GPU device, FSDP 1 (ici_fsdp_parallelism=1), Shardy partitioner (shardy=true)",
                  "per device 8, global 8 sequences of 1024 tokens",
                  {"decoder_block": "llama2", "hardware": "gpu", "base_emb_dim": "512",
                   "base_num_query_heads": "8", "base_num_kv_heads": "4", "head_dim": "64",
                   "base_mlp_dim": "1536", "base_num_decoder_layers": "4", "vocab_size": "32000",
                   "ici_fsdp_parallelism": "1", "per_device_batch_size": "8", "max_target_length": "1024",
                   "steps": "60", "eval_interval": "20", "remat_policy": "full"},
                  "  XLA_FLAGS="),
}


@pytest.mark.parametrize("recipe", list(_RECIPE_BANNERS))
@pytest.mark.parametrize("mode", list(MODES))
def test_dry_run_banner_of_each_mode(recipe, mode, tmp_path):
    parallelism, batch, model_arguments, xla_flags = _RECIPE_BANNERS[recipe]
    out = _dry_run(recipe, "--mode", mode, "--out", str(tmp_path / "run"))
    lines = out.splitlines()
    assert lines[0] == f"jax-aiter recipe {recipe} --mode {mode}"
    assert _BANNER_LINES[mode] in out
    assert "LM head (logits_dense) and token embedding: MaxText's own BF16 in every mode" in out
    assert "attention=jax_aiter: jax_aiter.mha.flash_attn_func" in out
    assert f"  parallelism  {parallelism}" in lines
    assert f"  batch        {batch}" in lines
    assert "compute bfloat16, weights float32, gradients float32, AdamW moments float32" in out
    arguments = lines[lines.index("MaxText arguments (maxtext.trainers.pre_train.train.main argv):") + 1:
                      lines.index("XLA flags:")]
    assert arguments[0].strip().endswith("configs/base.yml")
    pairs = dict(a.strip().split("=", 1) for a in arguments[1:])
    expected = {"shardy": "true", "dtype": "bfloat16", "weight_dtype": "float32", "grad_dtype": "float32",
                "mu_dtype": "float32", "attention": "jax_aiter", "quantization": "", "packing": "false",
                "opt_type": "adamw", "run_name": f"{recipe}-{mode}", "enable_mllog": "true",
                "mllog_file": str(tmp_path / "run" / "mllog.txt"), "dataset_type": "synthetic",
                **model_arguments}
    assert {k: pairs.get(k) for k in expected} == expected
    assert xla_flags in lines
    assert "  DECOUPLE_GCLOUD=TRUE" in lines


def test_dry_run_banner_of_a_closing_phase(tmp_path):
    out = _dry_run("cpu-tiny", "--mode", "mxfp4", "--final-mode", "fp8", "--out", str(tmp_path / "run"))
    lines = out.splitlines()
    assert lines[0] == "jax-aiter recipe cpu-tiny --mode mxfp4 --final-mode fp8 --final-fraction 0.25"
    # 12 steps, the last round(12 * 0.25) = 3 in FP8.
    assert "  steps        12 (steps 0-8 in mode mxfp4, then a closing phase)" in lines
    assert any(line.startswith("  closing      steps 9-11: mode fp8, PrecisionPolicy.fp8()") for line in lines)
    closing = lines[lines.index("MaxText arguments of the closing phase, where they differ:") + 1:
                    lines.index("XLA flags:")]
    assert closing == ["  steps=12", f"  mllog_file={tmp_path / 'run' / 'mllog-closing.txt'}",
                       "  save_checkpoint_on_completion=false"]


def test_resolve_a_closing_phase():
    from jax_aiter.precision import PrecisionPolicy, PrecisionSchedule

    r = resolve("cpu-tiny", "mxfp4", "/runs/a", final_mode="fp8", final_fraction=0.25)
    assert (r.phase_modes, r.final_from, r.steps) == (("mxfp4", "fp8"), 9, 12)
    first, closing = dict(r.phase_overrides(0)), dict(r.phase_overrides(1))
    assert (first["steps"], closing["steps"]) == ("9", "12")
    assert (first["save_checkpoint_on_completion"], closing["save_checkpoint_on_completion"]) == ("true", "false")
    assert (first["mllog_file"], closing["mllog_file"]) == ("/runs/a/mllog.txt", "/runs/a/mllog-closing.txt")
    same = ("run_name", "base_output_directory", "enable_checkpointing", "async_checkpointing",
            "save_checkpoint_on_start", "checkpoint_period", "learning_rate_schedule_steps")
    assert [first[k] for k in same] == [closing[k] for k in same] == [
        "cpu-tiny-mxfp4-then-fp8", "/runs/a/maxtext", "true", "false", "false", "13", "12"]
    assert r.maxtext_argv(1)[2:] == [f"{k}={v}" for k, v in r.phase_overrides(1)]
    assert [p["mode"] for p in r.as_json()["phases"]] == ["mxfp4", "fp8"]
    with pytest.raises(ValueError, match=r"phase must be in \[0, 2\)"):
        r.phase_overrides(2)
    # The recipe's own schedule length stays (llama3.1-8b decays over 37500 steps, whatever --steps says).
    llama = resolve("llama3.1-8b", "mxfp4", "/runs/b", steps=1000, final_mode="bf16", final_fraction=0.1)
    assert dict(llama.phase_overrides(0))["learning_rate_schedule_steps"] == "37500"
    assert dict(llama.phase_overrides(0))["steps"] == "900"
    # The first closing step is PrecisionSchedule's.
    for steps, fraction in ((12, 0.25), (1000, 0.1), (7, 0.5), (2000, 0.25), (3, 0.34)):
        schedule = PrecisionSchedule(PrecisionPolicy.mxfp4(), PrecisionPolicy.fp8(), fraction)
        run = resolve("cpu-tiny", "mxfp4", "/runs/c", steps=steps, final_mode="fp8", final_fraction=fraction)
        assert run.final_from == schedule.final_from(steps), (steps, fraction)
    # Without a closing phase nothing changes: one process, the overrides as they are, no checkpoint.
    plain = resolve("cpu-tiny", "mxfp4", "/runs/d")
    assert plain.phase_modes == ("mxfp4",) and plain.phase_overrides(0) == plain.overrides
    assert dict(plain.overrides)["enable_checkpointing"] == "false"


@pytest.mark.parametrize("kwargs, message", [
    (dict(final_fraction=0.25), "a closing phase needs final_mode too"),
    (dict(final_mode="nvfp4", final_fraction=0.25), "final_mode must be one of"),
    (dict(final_mode="fp8"), r"final_fraction must be a number in \(0, 1\)"),
    (dict(final_mode="fp8", final_fraction=1.0), r"final_fraction must be a number in \(0, 1\)"),
    (dict(final_mode="fp8", final_fraction=True), r"final_fraction must be a number in \(0, 1\)"),
    (dict(final_mode="fp8", final_fraction=0.01), "0.01 of 12 steps leaves a phase without steps"),
])
def test_resolve_rejects_a_bad_closing_phase(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve("cpu-tiny", "mxfp4", "unused", **kwargs)


def test_llama_schedule_matches_the_mlperf_reference_point():
    """Global batch 32 (8 x 4): mlperf-logging's llama31_8b_ref_32 warms up over 4096 samples, and the closed
    rules decay over 1,200,000 samples; MaxText's warmup is int(schedule_steps * warmup_steps_fraction)."""
    overrides = dict(resolve("llama3.1-8b", "mxfp4", "unused").overrides)
    schedule = int(overrides["learning_rate_schedule_steps"])
    assert schedule * 32 == 1_200_000
    assert int(schedule * float(overrides["warmup_steps_fraction"])) * 32 == 4096
    assert overrides["learning_rate"] == "0.0008"
    assert overrides["eval_steps"] == "32"  # 1024 evaluation samples


def test_resolve_data_overrides_and_flags(tmp_path):
    r = resolve("llama3.1-8b", "fp8", tmp_path, steps=100, data="/c4/train", eval_data="/c4/val", eod_id=128001,
                dump_hlo=True, overrides=["learning_rate=1e-4", "remat_policy=minimal"],
                environ_xla_flags="--xla_dump_hlo_as_text")
    pairs = dict(r.overrides)
    assert (pairs["dataset_type"], pairs["grain_file_type"], pairs["grain_train_files"],
            pairs["grain_eval_files"], pairs["mmap_eod_id"], pairs["reset_attention_mask"]) == (
        "grain", "mmap", "/c4/train", "/c4/val", "128001", "false")
    assert (pairs["learning_rate"], pairs["remat_policy"], pairs["steps"], r.steps) == ("1e-4", "minimal",
                                                                                       "100", 100)
    assert r.xla_flags == ("--xla_dump_hlo_as_text", "--xla_gpu_enable_latency_hiding_scheduler=true",
                           f"--xla_dump_to={tmp_path / 'hlo'}", "--xla_dump_hlo_module_re=jit_train_step")
    assert r.maxtext_argv()[2:] == [f"{k}={v}" for k, v in r.overrides]


@pytest.mark.parametrize("kwargs, message", [
    (dict(recipe="llama3", mode="mxfp4"), "recipe must be one of"),
    (dict(recipe="llama3.1-8b", mode="nvfp4"), "mode must be one of"),
    (dict(recipe="llama3.1-8b", mode="bf16", steps=0), "steps must be a positive int"),
    (dict(recipe="llama3.1-8b", mode="bf16", data="/c4/train"), "data and eval_data go together"),
    (dict(recipe="llama3.1-8b", mode="bf16", data="/a", eval_data="/b"), "eod_id"),
    (dict(recipe="llama3.1-8b", mode="bf16", overrides=["steps"]), "expected MaxText's key=value"),
])
def test_resolve_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve(out="unused", **kwargs)


def test_recipe_choices_are_the_recipes():
    done = subprocess.run([sys.executable, "-m", "jax_aiter.cli", "recipe", "gpu-large", "--mode", "bf16",
                           "--out", "unused", "--dry-run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    # argparse's wording: "invalid choice: 'gpu-large' (choose from ...)", the choices quoted or not by version.
    offered = done.stderr.partition("(choose from ")[2]
    assert "invalid choice: 'gpu-large'" in done.stderr
    assert sorted(re.findall(r"[\w.-]+", offered)) == sorted(RECIPES)


def test_training_process_checks_the_devices():
    """The tests' jax: the CPU backend with the 8 virtual devices of conftest's XLA_FLAGS (or 1 without them)."""
    import dataclasses

    import jax

    from jax_aiter.maxtext._train import check_devices

    count = jax.device_count()
    with pytest.raises(SystemExit, match=f"jax-aiter recipe gpu-small: needs 1 GPU device, but jax's default "
                       f"backend here has {count} CPU device.*CUDA_VISIBLE_DEVICES"):
        check_devices(RECIPES["gpu-small"])
    with pytest.raises(SystemExit, match=f"needs {count + 1} CPU devices, but .* has {count} CPU"):
        check_devices(dataclasses.replace(RECIPES["cpu-tiny"], devices=count + 1))
    check_devices(dataclasses.replace(RECIPES["cpu-tiny"], devices=count))


def test_run_refuses_a_used_output_directory(tmp_path):
    (tmp_path / "previous.log").write_text("an earlier attempt")
    with pytest.raises(FileExistsError, match="never reuses an output directory"):
        run(resolve("cpu-tiny", "bf16", tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["previous.log"]


# --- the MaxText side, in process --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def integration():
    pytest.importorskip("maxtext")
    from jax_aiter.maxtext import _integration

    yield _integration
    _integration.disable()


# MaxText's projections: (lhs shape, kernel shape, contracting dims): q/k/v [B, S, E] x [E, H, D], the
# attention output [B, S, H, D] x [H, D, E], a fused MLP input [B, S, E] x [E, 2, M].
_PROJECTIONS = [((2, 3, 64), (64, 2, 64), ((2,), (0,))), ((2, 3, 2, 64), (2, 64, 64), ((2, 3), (0, 1))),
                ((2, 3, 64), (64, 2, 128), ((2,), (0,)))]


@pytest.mark.parametrize("lhs_shape, rhs_shape, contract", _PROJECTIONS)
def test_policy_dot_general_is_maxtexts_contraction(integration, lhs_shape, rhs_shape, contract):
    """With recipe None (the BF16 gemm) the mapping onto a[..., K] @ b[N, K]^T must give dot_general's values
    and dimension order: compared with float64 numpy on the same bf16 values, within the output's bf16 rounding
    (half an ulp: at most 2^-8 of the value, 8 significand bits) plus float32 accumulation (K * 2^-24 of
    sum |a||b|)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal(lhs_shape), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal(rhs_shape), jnp.bfloat16)
    dims = (contract, ((), ()))
    got = np.asarray(integration.policy_dot_general(lhs, rhs, dims, None), np.float64)
    a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    want = np.tensordot(a, b, axes=contract)
    k = math.prod(lhs_shape[d] for d in contract[0])
    bound = 2.0 ** -8 * np.abs(want) + k * 2.0 ** -24 * np.tensordot(np.abs(a), np.abs(b), axes=contract)
    assert got.shape == jax.eval_shape(functools.partial(jax.lax.dot_general, dimension_numbers=dims),
                                       lhs, rhs).shape
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("recipe_name", ["mxfp4", "fp8"])
def test_policy_dot_general_feeds_our_op_the_transposed_kernel(integration, recipe_name):
    """Quantized recipes: the same numbers as the op called on x = lhs[..., K] and w = kernel^T [N, K] by hand."""
    import jax.numpy as jnp

    from jax_aiter.gemm_fp4 import gemm_fp4_bf16
    from jax_aiter.gemm_fp8 import gemm_fp8
    from jax_aiter.precision import PrecisionPolicy

    recipe = getattr(PrecisionPolicy, recipe_name)().linear
    op = gemm_fp4_bf16 if recipe_name == "mxfp4" else gemm_fp8
    rng = np.random.default_rng(1)
    lhs = jnp.asarray(rng.standard_normal((2, 3, 2, 64)), jnp.bfloat16)
    kernel = jnp.asarray(rng.standard_normal((2, 64, 128)), jnp.bfloat16)
    got = integration.policy_dot_general(lhs, kernel, (((2, 3), (0, 1)), ((), ())), recipe)
    want = op(lhs.reshape(2, 3, 128), kernel.reshape(128, 128).T, recipe)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_policies_maxtext_cannot_honour_are_refused(integration):
    import dataclasses

    from jax_aiter.gemm_fp4 import Mxfp4Recipe
    from jax_aiter.precision import PrecisionPolicy

    with pytest.raises(ValueError, match="policy.lm_head"):
        integration.AiterQuantization(PrecisionPolicy.mxfp4(lm_head=True))
    with pytest.raises(ValueError, match="bf16_first_blocks"):
        integration.AiterQuantization(PrecisionPolicy.mxfp4(bf16_first_blocks=1))
    # The default MXFP4 policy keeps its last third of the blocks BF16, which MaxText cannot express.
    with pytest.raises(ValueError, match="bf16_last_fraction"):
        integration.enable(PrecisionPolicy.mxfp4())
    stochastic = dataclasses.replace(Mxfp4Recipe.default(), gradient_stochastic=True)
    with pytest.raises(ValueError, match="stochastic rounding"):
        integration.enable(PrecisionPolicy.mxfp4(stochastic, bf16_last_fraction=0))
    with pytest.raises(TypeError, match="PrecisionPolicy"):
        integration.enable("mxfp4")


def test_enable_replaces_two_maxtext_functions_and_disable_restores_them(integration):
    from maxtext.layers import attention_op, quantizations

    from jax_aiter.precision import PrecisionPolicy

    originals = (quantizations.configure_quantization, attention_op.AttentionOp.apply_attention)
    every_block = PrecisionPolicy.mxfp4(bf16_last_fraction=0)
    assert integration.policy_for_mode("mxfp4") == every_block
    integration.enable(every_block)
    config = types.SimpleNamespace(quantization="", use_qwix_quantization=False)
    quant = quantizations.configure_quantization(config)
    assert isinstance(quant, integration.AiterQuantization) and quant.policy == every_block
    assert quant.dot_general_cls(("embed", "mlp"))().recipe == every_block.linear
    with pytest.raises(ValueError, match="quantization='fp8'"):
        quantizations.configure_quantization(types.SimpleNamespace(quantization="fp8"))
    integration.enable(PrecisionPolicy.bf16())  # BF16: MaxText's own path, which builds no quantization here
    assert quantizations.configure_quantization(config) is None
    integration.disable()
    assert (quantizations.configure_quantization, attention_op.AttentionOp.apply_attention) == originals
    assert integration.enabled_policy() is None


def test_enable_refuses_an_untested_maxtext(integration, monkeypatch):
    import maxtext

    monkeypatch.setattr(maxtext, "__version__", "0.2.4")
    with pytest.raises(RuntimeError, match=r"tested with MaxText 0\.2\.5, not 0\.2\.4"):
        integration.enable()


@pytest.mark.parametrize("config, message", [
    (dict(packing=True, grain_file_type="arrayrecord", reset_attention_mask=True), "packing=true"),
    (dict(packing=False, grain_file_type="mmap", reset_attention_mask=True), "reset_attention_mask=true"),
])
def test_attention_refuses_rows_of_several_segments(integration, config, message):
    with pytest.raises(ValueError, match=message):
        integration.check_attention_config(types.SimpleNamespace(**config))


# --- the cpu-tiny recipe trained by the runner (tier `maxtext`) --------------------------------------------


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """The out directory of `jax-aiter recipe cpu-tiny --mode M --dump-hlo [closing-phase options]` per mode
    and options, each run once."""
    pytest.importorskip("maxtext")
    pytest.importorskip("mlperf_logging")
    base = tmp_path_factory.mktemp("maxtext")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    # The native casts, forced: the CPU's default is XLA's code (the same bytes), which leaves no mark of its own
    # in the partitioned program, and the HLO test below checks that the recipe runs our casts.
    env["JAX_AITER_BACKEND"] = "cast_mxfp4=native,cast_mxfp4_dual=native"

    @functools.cache
    def out(mode: str, *closing: str):
        folder = base / "-".join((mode, *closing))
        done = subprocess.run([sys.executable, "-m", "jax_aiter.cli", "recipe", "cpu-tiny", "--mode", mode,
                               "--out", str(folder), "--dump-hlo", *closing], capture_output=True, text=True, env=env,
                              timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return folder

    return out


def _hlo(folder, stage: str) -> str:
    [path] = (folder / "hlo").glob(f"*jit_train_step*.{stage}.txt")
    return path.read_text()


def _float_all_gathers(text: str) -> list[str]:
    return re.findall(r"= ((?:f32|bf16)\[[0-9,]*\])\{[0-9,]*\} all-gather\(", text)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.maxtext
@pytest.mark.slow
def test_tiny_recipe_trains_under_each_mode(tiny_runs, mode):
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    folder = tiny_runs(mode)
    lines, _ = parse_file(str(folder / "mllog.txt"), ruleset="6.0.0")
    steps = [line.value for line in lines
             if line.key == "tracked_stats" and "reduced_train_loss" in line.value["value"]]
    # One event per step; samples_count is the samples trained after the step (global batch 8).
    assert [s["metadata"]["samples_count"] for s in steps] == [8 * (i + 1) for i in range(12)]
    losses = [s["value"]["reduced_train_loss"] for s in steps]
    # One fixed batch of 8 x 64 random tokens, memorized: the loss starts near ln(384) = 5.95 and must fall by
    # more than 10x in 12 steps (with these seeds each mode goes from 6.48-6.49 to 0.018-0.032).
    assert 5.0 < losses[0] < 7.0 and losses[-1] < losses[0] / 10
    assert (folder / "banner.txt").read_text().startswith(f"jax-aiter recipe cpu-tiny --mode {mode}\n")
    versions = json.loads((folder / "versions.json").read_text())
    assert versions["distributions"]["maxtext"]["version"] == "0.2.5"
    assert versions["jax_aiter"]["aiter_commit"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.maxtext
@pytest.mark.slow
def test_tiny_recipe_compiles_to_our_ops(tiny_runs, mode):
    """The training step XLA ran: every mode's attention is jax_aiter's (the reference's jitted `attention`
    called on q [B=8, S=64, Hq=4, D=64]); MXFP4 casts run our native cast (forced) and FSDP gathers the weights' FP4
    bytes (u8); FP8 gathers the weights' float8 copies (which XLA's CPU backend widens to f16 for the
    collective); in both, the only float weight gathered is the BF16 LM head / embedding (shapes with the
    vocabulary, 384). BF16 (MaxText's projections) is the control: float gathers of the projection weights."""
    folder = tiny_runs(mode)
    before, after = _hlo(folder, "before_optimizations"), _hlo(folder, "cpu_after_optimizations")
    assert re.search(r"jit_attention\S* = bf16\[8,64,4,64\]\S* call\(", before)
    casts = after.count('custom_call_target="ja_cast_mxfp4"')
    fp4_gathers = re.findall(r"= u8\[[0-9,]*\]\{[0-9,]*\} all-gather\(", after)
    f8_gathers = re.findall(r"= f16\[[0-9,]*\]\{[0-9,]*\} all-gather\(", after)
    projection_float_gathers = [g for g in _float_all_gathers(after) if "384" not in g]
    ours = "/AiterDotGeneral/" in after
    if mode == "mxfp4":
        assert ours and casts > 0 and fp4_gathers and not f8_gathers and not projection_float_gathers
    elif mode == "fp8":
        assert ours and casts == 0 and "f8e4m3fn" in after and f8_gathers and not fp4_gathers
        assert not projection_float_gathers
    else:
        assert not ours and casts == 0 and "f8e4m3fn" not in after and not fp4_gathers and not f8_gathers
        assert projection_float_gathers


# The closed llama31_8b rules of ruleset 6.0.0 that a toy run cannot meet: the sequence length (8192), the
# evaluation samples (1024) and the schedule over 1,200,000 samples (max_steps, decay = 1.2M - warmup).
_LLAMA_ONLY_RULES = {"max_sequence_length", "eval_samples", "opt_learning_rate_decay_steps", "max_steps"}


@pytest.mark.maxtext
@pytest.mark.slow
def test_tiny_mlperf_log_parses_and_checks(tiny_runs):
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    log = tiny_runs("mxfp4") / "mllog.txt"
    lines, errors = parse_file(str(log), ruleset="6.0.0")
    assert not errors
    keys = [line.key for line in lines]
    assert [keys.count(k) for k in ("init_start", "init_stop", "run_start", "run_stop")] == [1, 1, 1, 1]
    values = {line.key: line.value["value"] for line in lines}
    assert (values["submission_benchmark"], values["lowest_numerical_precision_in_linear"],
            values["global_batch_size"], values["max_sequence_length"]) == ("llama31_8b", "mxfp4", 8, 64)
    # cpu-tiny evaluates every 4 of its 12 steps.
    assert keys.count("eval_accuracy") == 3
    done = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                           "--ruleset", "6.0.0", str(log)], capture_output=True, text=True, timeout=300,
                          cwd=log.parent)
    failed = set(re.findall(r"CHECK for '(\w+)' failed", done.stdout + done.stderr))
    assert failed == _LLAMA_ONLY_RULES, done.stdout[-3000:]


def _train_losses(log) -> list[float]:
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    lines, errors = parse_file(str(log), ruleset="6.0.0")
    assert not errors
    return [line.value["value"]["reduced_train_loss"] for line in lines
            if line.key == "tracked_stats" and "reduced_train_loss" in line.value["value"]]


@pytest.mark.maxtext
@pytest.mark.slow
def test_tiny_recipe_closing_phase_resumes_from_the_checkpoint_in_its_mode(tiny_runs):
    """--mode mxfp4 --final-mode fp8 (12 steps, the last 3 in FP8): the first process trains steps 0-8 exactly
    as the one-phase MXFP4 run does (same program, same learning-rate schedule over 12 steps) and checkpoints;
    the second restores it and trains steps 9-11 through gemm_fp8. Its losses continue the MXFP4 run's, within
    a factor 2 (a re-initialized model would start near ln(384) = 5.95; with these seeds 0.033-0.026 against
    MXFP4's 0.041-0.032), and differ from them, being another precision's."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    folder = tiny_runs("mxfp4", "--final-mode", "fp8")
    mxfp4 = _train_losses(tiny_runs("mxfp4") / "mllog.txt")
    first, closing = _train_losses(folder / "mllog.txt"), _train_losses(folder / "mllog-closing.txt")
    assert len(mxfp4) == 12 and first == mxfp4[:9]
    assert len(closing) == 3
    for got, mxfp4_loss in zip(closing, mxfp4[9:], strict=True):
        assert got != mxfp4_loss and mxfp4_loss / 2 < got < 2 * mxfp4_loss, (closing, mxfp4[9:])
    log = (folder / "train.log").read_text()
    assert "jax-aiter recipe: closing phase, steps 9-11 in mode fp8, resumed from the checkpoint of step 8" in log
    assert "restoring from this run's directory step 8" in log
    lines, _ = parse_file(str(folder / "mllog-closing.txt"), ruleset="6.0.0")
    values = {line.key: line.value["value"] for line in lines}
    assert values["lowest_numerical_precision_in_linear"] == "fp8"
    programs = [path.read_text() for path in (folder / "hlo").glob("*jit_train_step*.cpu_after_optimizations.txt")]
    assert any("f8e4m3fn" in text and "/AiterDotGeneral/" in text for text in programs)
