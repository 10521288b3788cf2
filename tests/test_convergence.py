"""jax-aiter convergence: the schedule, the gap arithmetic, merging, model shapes, argument errors, and (slow) the
benchmark itself on the bundled real-text sample with cpu-tiny: the default MXFP4 policy passes the gate, a
deliberately broken recipe fails it, every arm starts from the same weights and data, the MLPerf log parses."""

import functools
import hashlib
import itertools
import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mxfp4_oracle as oracle
from jax_aiter import cli, precision
from jax_aiter.examples import convergence, models, text_data, tiny_llama
from jax_aiter.gemm_fp4 import gemm_fp4_bf16

pytest.importorskip("jax_aiter.mha")

# The CPU run of the slow tests: cpu-tiny on the bundled sample, 100 steps, held-out loss every 20 steps (the gap
# averages the evaluations at steps 60, 80 and 100). Measured on the 2-core CPU with the reference backends, seed 0,
# the same in repeated runs: the default MXFP4 policy +0.85 % of BF16's held-out loss (2026-12-03); the broken recipe
# below +27.0 % (3.5824 against 2.8205, measured before the reference attention's rewrite). The gate sits between
# them, a factor of 5 or more from each.
RUN = ["--model", "cpu-tiny", "--steps", "100", "--eval-every", "20"]
MAX_GAP = 5.0


# --- schedule, gaps, merging -----------------------------------------------------------------------------


def test_learning_rate_warms_up_then_decays_by_cosine_to_a_tenth():
    setup = convergence.Setup.for_model("cpu-tiny", steps=111, warmup_steps=10, learning_rate=1e-3)
    lr = [float(setup.learning_rate(step)) for step in (0, 9, 10, 60, 110)]
    # Warm-up: peak * (step + 1) / 10; then 1e-4 + 9e-4 * (1 + cos(pi * (step - 10) / 100)) / 2.
    np.testing.assert_allclose(lr, [1e-4, 1e-3, 1e-3, 5.5e-4, 1e-4], rtol=1e-6)


def _arm(held_out, train, ms=10.0, init="i", data="d"):
    return {"eval_steps": [0, 10, 20, 30, 40], "held_out_loss": [9.0, *held_out], "train_loss": train,
            "step_time_ms": ms, "init_sha256": init, "data_sha256": data, "held_out_sha256": "h"}


def test_gaps_use_the_last_three_evaluations_and_the_last_tenth_of_training():
    results = {"arms": {"bf16": _arm([5.0, 2.0, 2.0, 2.0], [3.0] * 18 + [2.0] * 2),
                        "mxfp4": _arm([5.0, 2.1, 2.2, 2.0], [3.0] * 18 + [2.0, 2.2], ms=15.0)}}
    table = convergence.gaps(results)
    assert table["bf16"]["held_out_gap"] == 0.0 and table["bf16"]["train_gap"] == 0.0
    # Held-out: mean(2.1, 2.2, 2.0) = 2.1 against 2.0; train: mean(2.0, 2.2) = 2.1 against 2.0.
    assert table["mxfp4"]["held_out_gap"] == pytest.approx(0.05)
    assert table["mxfp4"]["train_gap"] == pytest.approx(0.05)
    assert table["mxfp4"]["step_time_ratio"] == pytest.approx(1.5)
    alone = convergence.gaps({"arms": {"mxfp4": results["arms"]["mxfp4"]}})["mxfp4"]
    assert alone["held_out"] == pytest.approx(2.1) and alone["held_out_gap"] is None


def test_merge_adds_arms_and_refuses_what_cannot_be_compared():
    setup = convergence.Setup.for_model("cpu-tiny")
    corpus = {"name": "c", "sha256": "s"}
    results = convergence.merge(None, setup, corpus, "bf16", _arm([2.0] * 4, [2.0] * 10))
    results = convergence.merge(results, setup, corpus, "mxfp4", _arm([2.1] * 4, [2.1] * 10))
    assert list(results["arms"]) == ["bf16", "mxfp4"]
    replaced = convergence.merge(results, setup, corpus, "mxfp4", _arm([2.2] * 4, [2.2] * 10))
    assert replaced["arms"]["mxfp4"]["held_out_loss"][-1] == 2.2
    with pytest.raises(convergence.SetupMismatch, match="different setup .*differs in: config"):
        convergence.merge(results, convergence.Setup.for_model("cpu-tiny", steps=200), corpus)
    with pytest.raises(convergence.SetupMismatch, match="different corpus .*differs in: sha256"):
        convergence.merge(results, setup, {"name": "c", "sha256": "t"})
    with pytest.raises(convergence.SetupMismatch, match="different init_sha256 than arm 'bf16'"):
        convergence.merge(results, setup, corpus, "x", _arm([2.0] * 4, [2.0] * 10, init="other"))


def test_seed_summary_is_the_paired_mean_and_spread():
    tables = {seed: convergence.gaps({"arms": {"bf16": _arm([ref] * 4, [ref] * 10),
                                               "mxfp4": _arm([arm] * 4, [arm] * 10, ms=20.0)}})
              for seed, ref, arm in ((0, 2.0, 2.02), (1, 1.0, 1.02), (2, 4.0, 4.16))}
    summary = convergence.seed_summary(tables)
    row = summary["arms"]["mxfp4"]
    # Paired gaps 1 %, 2 %, 4 %: mean 7/3 %, sample variance ((4/3)^2 + (1/3)^2 + (5/3)^2) / 2 = 7/3 (%^2).
    np.testing.assert_allclose(row["held_out_gap_per_seed"], [0.01, 0.02, 0.04], rtol=1e-12)
    assert row["held_out_gap_mean"] == pytest.approx(0.07 / 3, rel=1e-12)
    assert row["held_out_gap_std"] == pytest.approx(0.01 * math.sqrt(7 / 3), rel=1e-12)
    assert row["held_out_gap_stderr"] == pytest.approx(0.01 * math.sqrt(7 / 9), rel=1e-12)
    assert (row["held_out_gap_min"], row["held_out_gap_max"]) == pytest.approx((0.01, 0.04), rel=1e-12)
    assert row["step_time_ratio_mean"] == pytest.approx(2.0)
    assert summary["seeds"] == [0, 1, 2] and summary["directories"] == ["seed-0", "seed-1", "seed-2"]
    assert row["seeds"] == [0, 1, 2]
    # An arm trained in seeds 0 and 2 only is summarized over those two; one trained in a single seed is not.
    tables[0]["fp8"] = tables[2]["fp8"] = {**tables[0]["mxfp4"], "held_out_gap": 0.002}
    tables[1]["mxfp4-all"] = tables[1]["mxfp4"]
    summary = convergence.seed_summary(tables)
    assert list(summary["arms"]) == ["bf16", "mxfp4", "fp8"] and summary["arms"]["fp8"]["seeds"] == [0, 2]
    assert summary["arms"]["fp8"]["held_out_gap_per_seed"] == [0.002, 0.002]
    with pytest.raises(ValueError, match="at least two seeds"):
        convergence.seed_summary({0: tables[0]})


def test_seed_summary_pairs_arms_seed_by_seed():
    """Gaps (%) per seed 0, 1, 2: base 1, 3, 2; better 0.5, 2, 1.8 (paired -0.5, -1, -0.2: mean -17/30 %, sample
    variance (0.0667^2 + 0.4333^2 + 0.3667^2) / 2 = 0.1633 %^2); late, trained in seeds 1 and 2 only: 4, 2
    (paired +1, 0); alone, trained in seed 0 only with base: no summary, so no pair."""
    gaps = {0: {"base": 0.01, "better": 0.005}, 1: {"base": 0.03, "better": 0.02, "late": 0.04},
            2: {"base": 0.02, "better": 0.018, "late": 0.02}}
    tables = {seed: convergence.gaps({"arms": {"bf16": _arm([1.0] * 4, [1.0] * 10), **{
        name: _arm([1.0 + gap] * 4, [1.0] * 10) for name, gap in arms.items()}}}) for seed, arms in gaps.items()}
    tables[0]["alone"] = tables[0]["base"]
    summary = convergence.seed_summary(tables, paired_to="base")
    assert summary["paired_to"] == "base"
    better = summary["arms"]["better"]["paired"]
    assert better["to"] == "base" and better["seeds"] == [0, 1, 2]
    np.testing.assert_allclose(better["held_out_gap_difference_per_seed"], [-0.005, -0.01, -0.002], atol=1e-12)
    assert better["held_out_gap_difference_mean"] == pytest.approx(-0.017 / 3, rel=1e-9)
    variance = ((-0.005 + 0.017 / 3) ** 2 + (-0.01 + 0.017 / 3) ** 2 + (-0.002 + 0.017 / 3) ** 2) / 2
    assert better["held_out_gap_difference_stderr"] == pytest.approx(math.sqrt(variance / 3), rel=1e-9)
    late = summary["arms"]["late"]["paired"]
    assert late["seeds"] == [1, 2]
    np.testing.assert_allclose(late["held_out_gap_difference_per_seed"], [0.01, 0.0], atol=1e-12)
    assert "paired" not in summary["arms"]["base"] and "paired" not in summary["arms"]["bf16"]
    assert "alone" not in summary["arms"]
    assert "paired_to" not in convergence.seed_summary(tables)
    with pytest.raises(ValueError, match="paired_to: no seed has the arm 'missing'"):
        convergence.seed_summary(tables, paired_to="missing")


def _stand_in_training(monkeypatch, held_out: dict) -> list:
    """Replace training by fixed losses: arm ``name`` of seed S returns held_out[S, name] for every evaluation and
    step. Returns the list that records each (seed, arm) trained, in order."""
    trained = []

    def stand_in(setup, data, name, arm, **_):
        trained.append((setup.config.seed, name))
        loss = held_out[setup.config.seed, name]
        return _arm([loss] * 4, [loss] * 10, init=f"seed {setup.config.seed}")

    monkeypatch.setattr(convergence, "train_arm", stand_in)
    return trained


def test_several_seeds_train_one_directory_each_and_gate_on_the_mean_gap(tmp_path, monkeypatch, capsys):
    """With --seed 0 1 every arm trains once per seed (here a stand-in for training that returns fixed losses):
    BF16 1.0 / 2.0, MXFP4 +3 % / +1 % — a mean gap of 2 %, which a 2.5 % gate passes though seed 0 alone would
    not, and a 1.5 % gate fails."""
    held_out = {(0, "bf16"): 1.0, (0, "mxfp4"): 1.03, (1, "bf16"): 2.0, (1, "mxfp4"): 2.02}
    trained = _stand_in_training(monkeypatch, held_out)
    argv = ["convergence", "--steps", "40", "--seed", "0", "1", "--arms", "bf16", "mxfp4", "--out", str(tmp_path)]
    assert cli.main([*argv, "--max-gap", "2.5"]) == 0
    assert trained == [(0, "bf16"), (0, "mxfp4"), (1, "bf16"), (1, "mxfp4")]
    assert "every arm's mean held-out gap over seeds is at most 2.5 %" in capsys.readouterr().out
    for seed in (0, 1):
        results = json.loads((tmp_path / f"seed-{seed}" / "convergence.json").read_text())
        assert results["setup"]["config"]["seed"] == seed and list(results["arms"]) == ["bf16", "mxfp4"]
    summary = json.loads((tmp_path / "seeds.json").read_text())
    np.testing.assert_allclose(summary["arms"]["mxfp4"]["held_out_gap_per_seed"], [0.03, 0.01], rtol=1e-12)
    assert summary["arms"]["mxfp4"]["held_out_gap_mean"] == pytest.approx(0.02, rel=1e-12)
    assert cli.main([*argv, "--max-gap", "1.5"]) == 1
    assert "mean held-out gap over seeds above 1.5 %: mxfp4" in capsys.readouterr().err


def test_paired_to_over_seeds_from_the_command_line(tmp_path, monkeypatch, capsys):
    """--paired-to prints and saves each arm's gap minus that arm's, seed by seed: mxfp4 +3 / +1 %, fp8 +1 / +1 %
    give fp8 - mxfp4 = -2 / 0 %, mean -1 %, standard error 1 %. It needs several seeds and a trained arm."""
    held_out = {(0, "bf16"): 1.0, (0, "mxfp4"): 1.03, (0, "fp8"): 1.01, (1, "bf16"): 2.0, (1, "mxfp4"): 2.02,
                (1, "fp8"): 2.02}
    trained = _stand_in_training(monkeypatch, held_out)
    argv = ["convergence", "--steps", "40", "--arms", "bf16", "mxfp4", "fp8", "--out", str(tmp_path)]
    assert cli.main([*argv, "--seed", "0", "1", "--paired-to", "mxfp4"]) == 0
    out = capsys.readouterr().out
    assert "minus mxfp4, paired" in out and "-1.00 % ± 1.00 (seeds 0 1)" in out
    fp8 = json.loads((tmp_path / "seeds.json").read_text())["arms"]["fp8"]["paired"]
    np.testing.assert_allclose(fp8["held_out_gap_difference_per_seed"], [-0.02, 0.0], atol=1e-12)
    assert len(trained) == 6
    assert cli.main([*argv, "--seed", "0", "--paired-to", "mxfp4"]) == 2
    assert "--paired-to compares arms over seeds" in capsys.readouterr().err
    assert cli.main([*argv[:3], "--arms", "bf16", "--seed", "0", "1", "--paired-to", "mxfp4-all",
                     "--out", str(tmp_path)]) == 2
    assert "--paired-to mxfp4-all: the arm is neither in --arms nor in a seed directory" in capsys.readouterr().err
    assert len(trained) == 6


def test_seeds_of_earlier_calls_join_the_summary_and_a_different_setup_is_refused(tmp_path, monkeypatch, capsys):
    """A call with --seed 2 3 into an --out that holds seed-0 and seed-1 summarizes all four seeds; a seed
    directory of another setup (here 30 steps, not 40) is refused before anything trains."""
    held_out = {(0, "bf16"): 1.0, (0, "mxfp4"): 1.03, (1, "bf16"): 2.0, (1, "mxfp4"): 2.02,
                (2, "bf16"): 1.0, (2, "mxfp4"): 1.0, (3, "bf16"): 1.0, (3, "mxfp4"): 1.04}
    trained = _stand_in_training(monkeypatch, held_out)
    argv = ["convergence", "--steps", "40", "--arms", "bf16", "mxfp4", "--out", str(tmp_path)]
    assert cli.main([*argv, "--seed", "0", "1"]) == 0
    assert cli.main([*argv, "--seed", "2", "3"]) == 0
    assert trained[4:] == [(2, "bf16"), (2, "mxfp4"), (3, "bf16"), (3, "mxfp4")]
    summary = json.loads((tmp_path / "seeds.json").read_text())
    assert summary["seeds"] == [0, 1, 2, 3]
    np.testing.assert_allclose(summary["arms"]["mxfp4"]["held_out_gap_per_seed"], [0.03, 0.01, 0.0, 0.04],
                               rtol=1e-12)
    capsys.readouterr()
    (tmp_path / "seed-x").mkdir()  # not a seed directory: ignored
    (tmp_path / "seed-x" / "convergence.json").write_text("{}")
    assert cli.main(["convergence", "--steps", "30", "--arms", "bf16", "--seed", "4", "5", "--out", str(tmp_path)]) == 2
    assert "seed-0: the existing results have a different setup" in capsys.readouterr().err
    assert len(trained) == 8


def test_merge_from_joins_arms_trained_by_other_processes(tmp_path, monkeypatch, capsys):
    """Two "processes" train into directories of their own (BF16 of seeds 0 and 1 into one, MXFP4 into another,
    each with an MLPerf log stand-in); --merge-from brings both into a third --out without training: the same
    gaps as one call would give (+3 / +1 %, mean 2 %), the logs copied. Refused: --arms with --merge-from, a
    source of another setup, and a seed no source holds."""
    held_out = {(0, "bf16"): 1.0, (0, "mxfp4"): 1.03, (1, "bf16"): 2.0, (1, "mxfp4"): 2.02}
    trained = _stand_in_training(monkeypatch, held_out)
    setup = ["convergence", "--steps", "40", "--seed", "0", "1"]
    first, second, merged = tmp_path / "first", tmp_path / "second", tmp_path / "merged"
    assert cli.main([*setup, "--arms", "bf16", "--out", str(first)]) == 0
    assert cli.main([*setup, "--arms", "mxfp4", "--out", str(second)]) == 0
    for seed in (0, 1):
        (second / f"seed-{seed}" / "mllog").mkdir()
        (second / f"seed-{seed}" / "mllog" / "mxfp4.log").write_text(f"log of seed {seed}")
    capsys.readouterr()
    assert cli.main([*setup, "--out", str(merged), "--merge-from", str(first), str(second), "--max-gap", "2.5"]) == 0
    out = capsys.readouterr().out
    assert f"seed 1 merged mxfp4 from {second / 'seed-1'}" in out
    assert len(trained) == 4  # the two training calls' arms; merging trained nothing
    summary = json.loads((merged / "seeds.json").read_text())
    np.testing.assert_allclose(summary["arms"]["mxfp4"]["held_out_gap_per_seed"], [0.03, 0.01], rtol=1e-12)
    for seed in (0, 1):
        results = json.loads((merged / f"seed-{seed}" / "convergence.json").read_text())
        assert list(results["arms"]) == ["bf16", "mxfp4"]
        assert (merged / f"seed-{seed}" / "mllog" / "mxfp4.log").read_text() == f"log of seed {seed}"

    assert cli.main([*setup, "--out", str(merged), "--merge-from", str(first), "--arms", "bf16"]) == 2
    assert "give one of them" in capsys.readouterr().err
    other = tmp_path / "other"
    assert cli.main(["convergence", "--steps", "30", "--seed", "0", "1", "--arms", "bf16", "--out", str(other)]) == 0
    capsys.readouterr()
    assert cli.main([*setup, "--out", str(tmp_path / "m2"), "--merge-from", str(other)]) == 2
    assert "the existing results have a different setup" in capsys.readouterr().err
    assert cli.main(["convergence", "--steps", "40", "--seed", "0", "7", "--out", str(tmp_path / "m3"),
                     "--merge-from", str(first)]) == 2
    assert "--merge-from: no directory holds seed-7" in capsys.readouterr().err
    assert not (tmp_path / "m3").exists()  # seed 0's merge was checked, not written


def test_model_shapes():
    # 75m, issue 18's 74.7 M: embedding and head 2 * 256 * 768, per block q and o 2 * 768^2, k and v
    # 2 * 768 * 192, SwiGLU 3 * 768 * 2048, two norms 2 * 768; twelve blocks and the final norm 768.
    # llama3.1-8b: Llama 3.1 8B's published parameter count (untied embedding and head).
    assert models.parameter_count(models.MODELS["75m"].config) == 74_730_240
    assert models.parameter_count(models.MODELS["llama3.1-8b"].config) == 8_030_261_248
    assert 340e6 < models.parameter_count(models.MODELS["350m"].config) < 360e6
    for name, model in models.MODELS.items():
        cfg = model.config
        # Every projection is MXFP4-able: K and N multiples of 64.
        assert all(d % 64 == 0 for d in (cfg.dim, cfg.mlp_dim, cfg.kv_heads * cfg.head_dim, cfg.vocab)), name
    assert [n for n, m in models.MODELS.items() if not m.trainable] == ["llama3.1-8b"]


def test_llama_8b_shape_lowers_with_the_default_mxfp4_policy():
    # Two of its 32 blocks (each block lowers to the same program): the full vocabulary, width and sequence length.
    setup = convergence.Setup.for_model("llama3.1-8b", layers=2)
    text = convergence.lower_step(setup, convergence.ARMS["mxfp4"].policy).as_text()
    assert "128256" in text and "14336" in text and "8192" in text
    assert "ui8" in text  # FP4 bytes: the block projections are MXFP4


# --- argument errors, before anything trains ------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--arms", "bf16", "bf16"], "an arm is named twice"),
    (["--seed", "1", "1"], "a seed is named twice"),
    (["--arms", "mxfp4", "--max-gap", "1", "--out", "{tmp}"], "--max-gap needs the bf16 arm"),
    (["--model", "75m"], "--data is required for model 75m"),
    (["--model", "no-such-model"], "model must be one of"),
    (["--model", "llama3.1-8b", "--data", "x"], "is a shape to lower (--lower-only)"),
    (["--steps", "100000"], "the benchmark stays under one"),
    (["--data", "{tmp}/missing.txt"], "no such file"),
    (["--steps", "4", "--arms", "bf16", "mxfp4-then-fp8"], "arm mxfp4-then-fp8: final_fraction 0.1 of 4 steps leaves"),
])
def test_convergence_rejects_bad_arguments_before_training(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(convergence, "train_arm", lambda *a, **k: pytest.fail("trained despite a bad argument"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(["convergence", *argv]) == 2
    assert message in capsys.readouterr().err


def test_convergence_refuses_an_out_directory_of_another_setup(tmp_path, capsys, monkeypatch):
    setup, data = convergence.load_data(convergence.Setup.for_model("cpu-tiny", steps=150),
                                        convergence.bundled_sample())
    convergence.save(convergence.merge(None, setup, data.corpus), tmp_path)
    monkeypatch.setattr(convergence, "train_arm", lambda *a, **k: pytest.fail("trained into a foreign --out"))
    assert cli.main(["convergence", "--steps", "200", "--out", str(tmp_path)]) == 2
    assert "different setup (differs in: config" in capsys.readouterr().err


def test_a_closing_phase_trains_its_last_steps_and_is_evaluated_under_its_own_policy():
    setup, data = convergence.load_data(convergence.Setup.for_model("cpu-tiny", steps=10, eval_every=5),
                                        convergence.bundled_sample())
    first, final = precision.PrecisionPolicy.bf16(), precision.PrecisionPolicy.fp8()
    arm = convergence.Arm(precision.PrecisionSchedule(first, final, 0.3), "bf16, then fp8 for the last 3 steps")
    record = convergence.train_arm(setup, data, "closing", arm)

    # The schedule by hand: steps 0-6 under the first policy, 7-9 under the final one.
    cfg = setup.config
    key = jax.random.key(cfg.seed)
    params = tiny_llama.init_params(cfg, key)
    opt_state = tiny_llama.adam_init(params)
    steps = {p: jax.jit(convergence.make_step(setup, p, jax.random.fold_in(key, 1))) for p in (first, final)}

    def text_loss(params, tokens, policy):
        return jnp.mean(tiny_llama.cross_entropy(tiny_llama.forward(params, tokens[:, :-1], cfg, policy),
                                                 tokens[:, 1:]))

    eval_losses = {p: jax.jit(functools.partial(text_loss, policy=p)) for p in (first, final)}

    def held_out(policy):
        return float(np.mean([float(eval_losses[policy](params, jnp.asarray(b))) for b in data.held_out]))

    expected_train, expected_held = [], [held_out(first)]
    batches = text_data.train_batches(data.train, cfg.batch, cfg.seq_len, cfg.seed)
    for step, batch in enumerate(itertools.islice(batches, cfg.steps)):
        policy = first if step < 7 else final
        params, opt_state, loss = steps[policy](params, opt_state, jnp.asarray(batch))
        expected_train.append(float(loss))
        if step + 1 in (5, 10):
            expected_held.append(held_out(policy))

    assert record["final_from_step"] == 7 and record["final_policy"]["linear"]["type"] == "Fp8Recipe"
    assert record["eval_steps"] == [0, 5, 10]
    np.testing.assert_allclose(record["train_loss"], expected_train, rtol=1e-6)
    np.testing.assert_allclose(record["held_out_loss"], expected_held, rtol=1e-6)
    assert record["final_step_time_ms"] > 0


def test_arm_holds_a_policy_as_its_one_phase_schedule_and_refuses_anything_else():
    policy = precision.PrecisionPolicy.mxfp4()
    arm = convergence.Arm(policy, "x")
    assert arm.schedule == precision.PrecisionSchedule(policy) and arm.policy is policy
    assert arm.final_policy is None and arm.final_from(10) == 10
    closing = convergence.ARMS["mxfp4-then-fp8"]
    assert closing.final_policy == precision.PrecisionPolicy.fp8() and closing.final_from(2000) == 1800
    with pytest.raises(TypeError, match="^schedule must be a PrecisionSchedule or a PrecisionPolicy, got str"):
        convergence.Arm("mxfp4", "x")


def test_list_arms(capsys):
    assert cli.main(["convergence", "--list-arms"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in convergence.ARMS)


# --- the benchmark on real text (slow) -------------------------------------------------------------------


def _unpaired_wgrad_hadamard(x, w, recipe=None, *, key=None):
    """gemm_fp4_bf16 with a deliberate bug: the weight gradient is computed from the output gradient rotated by a
    16-point Hadamard along the tokens, with no matching rotation of the activation (the recipe's own wgrad
    rotation then cancels on g and lands on x alone). Forward and input gradient are the library's."""
    real = gemm_fp4_bf16  # the library's, imported before any test replaces precision's

    @jax.custom_vjp
    def linear(x, w):
        return real(x, w, recipe, key=key)

    def fwd(x, w):
        return jax.vjp(lambda x, w: real(x, w, recipe, key=key), x, w)

    def bwd(vjp, g):
        dx, _ = vjp(g)
        hadamard = jnp.asarray(oracle.sylvester_matrix(16) / 4.0, jnp.float32)  # orthonormal
        chunks = g.reshape(-1, 16, g.shape[-1]).astype(jnp.float32)
        rotated = jnp.einsum("ij,cjn->cin", hadamard, chunks).astype(g.dtype).reshape(g.shape)
        return dx, vjp(rotated)[1]

    linear.defvjp(fwd, bwd)
    return linear(x, w)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The CLI trains bf16 and the default MXFP4 policy once; the tests below read what it wrote."""
    out = tmp_path_factory.mktemp("convergence")
    code = cli.main(["convergence", *RUN, "--arms", "bf16", "mxfp4", "--max-gap", str(MAX_GAP), "--out", str(out)])
    return code, out, json.loads((out / "convergence.json").read_text())


@pytest.mark.slow
def test_default_mxfp4_policy_passes_the_gate(reference_run):
    code, out, results = reference_run
    summary = results["summary"]
    print({name: row["held_out_gap"] for name, row in summary.items()})
    assert code == 0, summary
    bf16, mxfp4 = results["arms"]["bf16"], results["arms"]["mxfp4"]
    # BF16 must learn more than byte frequencies: the held-out cross-entropy of the training split's byte
    # frequencies (add-one smoothed; 3.551 nats) is the oracle, computed in float64.
    train, held_out = text_data.split(text_data.open_corpus(convergence.bundled_sample()), 0.05)
    frequencies = np.bincount(train.tokens, minlength=256) + 1.0
    unigram = -np.mean(np.log(frequencies / frequencies.sum())[held_out.tokens])
    assert summary["bf16"]["held_out"] < 0.9 * unigram < math.log(256)
    assert summary["mxfp4"]["held_out_gap"] <= MAX_GAP / 100
    assert mxfp4["train_loss"] != bf16["train_loss"]  # the FP4 path was taken
    assert bf16["eval_steps"] == [0, 20, 40, 60, 80, 100] and len(bf16["train_loss"]) == 100
    assert results["corpus"]["sha256"] == "2371ac580ba238c28904ac1e588c4b4f0c323ce5783884d52b00aaf41b59b0ad"
    assert (out / "convergence.png").stat().st_size > 0


@pytest.mark.slow
def test_every_arm_starts_from_the_same_weights_and_sees_the_same_batches(reference_run):
    _, _, results = reference_run
    setup = convergence.Setup.for_model("cpu-tiny", steps=100, eval_every=20)
    cfg = setup.config
    params = jax.device_get(tiny_llama.init_params(cfg, jax.random.key(cfg.seed)))
    train, held_out = text_data.split(text_data.open_corpus(convergence.bundled_sample()), 0.05)
    batches = list(itertools.islice(text_data.train_batches(train, cfg.batch, cfg.seq_len, cfg.seed), cfg.steps))
    held = text_data.held_out_batches(held_out, setup.eval_batches, cfg.batch, cfg.seq_len)

    def sha(arrays):
        digest = hashlib.sha256()
        for a in arrays:
            digest.update(np.ascontiguousarray(a).tobytes())
        return digest.hexdigest()

    for name, arm in results["arms"].items():
        assert arm["init_sha256"] == sha(jax.tree.leaves(params)), name
        assert arm["data_sha256"] == sha(batches), name
        assert arm["held_out_sha256"] == sha(held), name
    assert len({b.tobytes() for b in batches}) == len(batches)  # no batch repeats: under one epoch


@pytest.mark.slow
def test_mllog_lines_parse(reference_run):
    pytest.importorskip("mlperf_logging", reason="the optional extra jax-aiter[convergence] is not installed")
    _, out, results = reference_run
    for name in results["arms"]:
        lines = (out / "mllog" / f"{name}.log").read_text().splitlines()
        events = []
        for line in lines:
            assert line.startswith(":::MLLOG "), line
            event = json.loads(line[len(":::MLLOG "):])
            assert set(event) >= {"namespace", "time_ms", "event_type", "key", "value", "metadata"}
            events.append(event)
        keys = [e["key"] for e in events]
        assert keys[0] == "cache_clear" and keys[-1] == "run_stop"
        assert {"init_start", "init_stop", "run_start", "seed", "global_batch_size", "opt_base_learning_rate",
                "opt_gradient_clip_norm", "precision_arm"} <= set(keys)
        accuracy = [e for e in events if e["key"] == "eval_accuracy"]
        assert [e["metadata"]["step"] for e in accuracy] == results["arms"][name]["eval_steps"]
        assert [e["value"] for e in accuracy] == results["arms"][name]["held_out_loss"]
        assert accuracy[-1]["metadata"]["samples_count"] == 100 * 8  # steps x batch
        assert events[-1]["metadata"]["status"] == "success"
        assert [e["value"] for e in events if e["key"] == "precision_arm"] == [name]


@pytest.mark.slow
def test_broken_recipe_fails_the_gate_and_the_exit_code_says_so(reference_run, tmp_path, monkeypatch, capsys):
    _, out, _ = reference_run
    shutil.copy(out / "convergence.json", tmp_path / "convergence.json")  # the BF16 arm to compare with
    monkeypatch.setattr(precision, "gemm_fp4_bf16", _unpaired_wgrad_hadamard)
    code = cli.main(["convergence", *RUN, "--arms", "mxfp4", "--max-gap", str(MAX_GAP), "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "convergence.json").read_text())["summary"]
    print({name: row["held_out_gap"] for name, row in summary.items()})
    assert code == 1
    assert summary["mxfp4"]["held_out_gap"] > MAX_GAP / 100
    assert f"held-out gap above {MAX_GAP} %: mxfp4" in capsys.readouterr().err
