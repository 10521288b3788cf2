import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_aiter import cli
from jax_aiter.examples import tiny_llama

pytest.importorskip("jax_aiter.mha")


def test_batches_are_arithmetic_sequences():
    cfg = tiny_llama.Config(batch=4, seq_len=10, vocab=16)
    tokens = np.asarray(tiny_llama.make_batch(cfg, jax.random.key(0)))
    strides = (tokens[:, 1] - tokens[:, 0]) % 16
    assert np.all((strides >= 1) & (strides < 8))
    np.testing.assert_array_equal(tokens, (tokens[:, :1] + strides[:, None] * np.arange(10)) % 16)


def test_forward_shapes_and_causality():
    cfg = tiny_llama.Config(batch=2, seq_len=8)
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    tokens = tiny_llama.make_batch(cfg, jax.random.key(1))
    logits = tiny_llama.forward(params, tokens, cfg)
    assert logits.shape == (2, 8, cfg.vocab)
    # Changing the last token must not change earlier positions' logits.
    changed = tiny_llama.forward(params, tokens.at[:, -1].set((tokens[:, -1] + 1) % cfg.vocab), cfg)
    np.testing.assert_array_equal(np.asarray(logits[:, :-1]), np.asarray(changed[:, :-1]))


def test_adam_matches_hand_computed_first_step():
    params = {"w": jnp.array([1.0, -2.0])}
    grads = {"w": jnp.array([0.5, -0.1])}
    new, state = tiny_llama.adam_update(params, grads, tiny_llama.adam_init(params), lr=0.1)
    # First step: m_hat = g, v_hat = g^2, update = lr * sign(g) (up to eps).
    np.testing.assert_allclose(np.asarray(new["w"]), [0.9, -1.9], rtol=1e-6)
    assert int(state["t"]) == 1


def test_demo_command_trains_and_loss_falls(capsys):
    assert cli.main(["demo", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "rms_norm" in out and "loss: first steps" in out


@pytest.mark.parametrize("argv, message", [
    (["demo", "--steps", "-3"], "must be at least 10, got -3"),
    (["demo", "--steps", "5"], "must be at least 10, got 5"),
    (["convergence", "--steps", "0"], "must be at least 1, got 0"),
    (["demo", "--steps", "many"], "expected an integer"),
])
def test_cli_rejects_step_counts_before_training(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_convergence_rejects_an_unknown_arm_before_training(capsys, monkeypatch):
    from jax_aiter.examples import convergence

    monkeypatch.setattr(convergence, "train_arm", lambda *a, **k: pytest.fail("trained before checking arm names"))
    assert cli.main(["convergence", "--arms", "no-such-arm", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "unknown arm(s) no-such-arm" in err and "mxfp4-all" in err
