"""`jax-aiter bench`: a quick run on this machine writes the JSON and the table; per-platform variants of the
default selection are reported by `jax_aiter.info()` (docs/performance.md)."""

import itertools
import json

import jax.numpy as jnp
import pytest

import jax_aiter
from jax_aiter import _backend, benchmark, cli


def test_quick_bench_writes_json_and_table(tmp_path, capsys):
    assert cli.main(["bench", "--quick", "--only", "linear", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["complete"] and result["quick"] and result["sections"] == ["linear"]
    names = [row["name"] for row in result["rows"]]
    assert names == ["gemm_fp4_bf16 fwd", "gemm_fp4_bf16 fwd+bwd"]
    assert all(row["mxfp4_s"] > 0 and row["bf16_s"] > 0 for row in result["rows"])
    out = capsys.readouterr().out
    assert "gemm_fp4_bf16 fwd+bwd" in out and "not a measurement" in out
    assert any("gemm_fp4" in line for line in result["selection"])


def test_quick_training_step_rows(tmp_path, capsys):
    """The train section times the convergence benchmark's step under each arm (cpu-tiny with --quick), the
    non-BF16 arms against the BF16 step, and the every-block MXFP4 row carries the issue's target."""
    assert cli.main(["bench", "--quick", "--only", "train", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(row["section"], row["name"], row["model"]) for row in rows] == [
        ("train", "bf16", "cpu-tiny"), ("train", "fp8", "cpu-tiny"), ("train", "mxfp4-every-block", "cpu-tiny"),
        ("train", "mxfp4-every-block-weights-once", "cpu-tiny"), ("train", "mxfp4", "cpu-tiny"),
        ("train", "mxfp4-sr-grad", "cpu-tiny")]
    bf16 = rows[0]
    assert bf16["shape"] == [8, 64, 128, 2] and "bf16_over_this" not in bf16
    for row in rows:
        assert row["tokens_per_s"] == pytest.approx(8 * 64 / row["time_s"])
    for row in rows[1:]:
        assert row["bf16_over_this"] == pytest.approx(bf16["time_s"] / row["time_s"])
    assert rows[2]["target"] == {"this_over_bf16": benchmark.TRAIN_MXFP4_VS_BF16}
    assert not any("target" in row for row in rows[3:])
    assert "cpu-tiny mxfp4" in capsys.readouterr().out


def test_bench_rejects_an_unknown_section(tmp_path):
    with pytest.raises(SystemExit):
        benchmark.main(["--only", "nope", "--out", str(tmp_path)])


def test_variants_say_which_direction_runs_where():
    import jax_aiter.activation  # noqa: F401
    import jax_aiter.rmsnorm  # noqa: F401

    silu = next(i for i in _backend.implementations("silu_and_mul") if i.name == "native")
    assert "XLA" in silu.note_for("cuda")
    assert silu.fn_for("cuda") is not silu.fn and silu.fn_for("cpu") is silu.fn
    assert silu.note_for("cpu") is None
    # RMSNorm's kernels run in both directions on CUDA: its exact reference is no longer the faster forward.
    norm = next(i for i in _backend.implementations("rms_norm") if i.name == "native")
    assert norm.fn_for("cuda") is norm.fn and norm.note_for("cuda") is None
    assert "rms_norm" in jax_aiter.info()


@pytest.mark.parametrize("settle_s", [0.0, 0.02])
def test_timed_together_settles_each_program_before_its_batch(settle_s):
    """Batches interleave program by program; with settle_s each batch follows untimed calls of its own program."""
    log = []
    fns = {name: (lambda args, name=name: log.append(name) or jnp.zeros(())) for name in "ab"}
    times = benchmark.timed_together(fns, None, batches=2, calls=3, settle_s=settle_s)
    assert set(times) == {"a", "b"} and all(t > 0 for t in times.values())
    runs = [(name, len(list(calls))) for name, calls in itertools.groupby(log[2:])]  # after one warm-up call each
    assert [name for name, _ in runs] == ["a", "b", "a", "b"]
    assert all(count > 3 if settle_s else count == 3 for _, count in runs), runs
