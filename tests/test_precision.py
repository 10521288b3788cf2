"""PrecisionPolicy: which projection gets which recipe (roles, first/last blocks), validation, hashing, and
``project``'s dispatch to the BF16, MXFP4 and FP8 GEMMs; PrecisionSchedule: which policy trains which step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
import mxfp4_oracle as oracle
from _programs import cast_calls
from jax_aiter.gemm import gemm
from jax_aiter.gemm_fp4 import Mxfp4Recipe, gemm_fp4_bf16
from jax_aiter.gemm_fp8 import Fp8Recipe, gemm_fp8
from jax_aiter.precision import BLOCK_ROLES, ROLES, PrecisionPolicy, PrecisionSchedule, project

SR = Mxfp4Recipe(gradient_stochastic=True)


def _recipes(policy, blocks):
    """{role: [recipe of block 0, ..., block n-1]} for the block roles, plus the LM head and embedding."""
    table = {role: [policy.recipe_for(role, i, blocks) for i in range(blocks)] for role in BLOCK_ROLES}
    return {**table, "lm_head": policy.recipe_for("lm_head"), "embedding": policy.recipe_for("embedding")}


def test_roles():
    assert ROLES == ("attention", "mlp", "lm_head", "embedding")


def test_bf16_policy_is_bf16_everywhere():
    assert _recipes(PrecisionPolicy.bf16(), 3) == {"attention": [None] * 3, "mlp": [None] * 3, "lm_head": None,
                                                    "embedding": None}


def test_mxfp4_policy_keeps_lm_head_embedding_and_the_last_third_bf16_by_default():
    keyed = Mxfp4Recipe.keyed_hadamard()
    assert keyed == Mxfp4Recipe(hadamard_seed=0)
    # 12 blocks (the 75 M model the default was measured on): blocks 8-11 BF16; 2 blocks: a third is no block.
    assert _recipes(PrecisionPolicy.mxfp4(), 12) == {"attention": [keyed] * 8 + [None] * 4,
                                                      "mlp": [keyed] * 8 + [None] * 4, "lm_head": None,
                                                      "embedding": None}
    assert _recipes(PrecisionPolicy.mxfp4(), 2) == {"attention": [keyed] * 2, "mlp": [keyed] * 2,
                                                     "lm_head": None, "embedding": None}
    every_block = PrecisionPolicy.mxfp4(Mxfp4Recipe.default(), bf16_last_fraction=0)
    assert _recipes(every_block, 12)["mlp"] == [Mxfp4Recipe.default()] * 12
    everything = PrecisionPolicy.mxfp4(SR, lm_head=True, embedding=True, bf16_last_fraction=0.0)
    assert _recipes(everything, 2) == {"attention": [SR] * 2, "mlp": [SR] * 2, "lm_head": SR, "embedding": SR}


def test_fp8_policy():
    fp8, e4m3 = Fp8Recipe.default(), Fp8Recipe(gradient_format="float8_e4m3fn")
    assert _recipes(PrecisionPolicy.fp8(), 2) == {"attention": [fp8] * 2, "mlp": [fp8] * 2, "lm_head": None,
                                                   "embedding": None}
    assert _recipes(PrecisionPolicy.fp8(e4m3, lm_head=True, bf16_first_blocks=1), 2) == {
        "attention": [None, e4m3], "mlp": [None, e4m3], "lm_head": e4m3, "embedding": None}
    # Recipes of both kinds in one policy: an FP8 LM head on MXFP4 blocks.
    mixed = PrecisionPolicy(linear=Mxfp4Recipe.default(), lm_head=fp8)
    assert mixed.recipe_for("lm_head") == fp8 and mixed.recipe_for("mlp", 0, 1) == Mxfp4Recipe.default()
    assert not PrecisionPolicy.fp8(lm_head=True).uses_stochastic_rounding


@pytest.mark.parametrize("fraction, last", [
    (1 / 3, {1: 0, 2: 0, 3: 1, 5: 1, 6: 2, 12: 4, 24: 8, 32: 10, 36: 12}),
    (0.25, {3: 0, 4: 1, 12: 3, 32: 8}),
    (0.0, {1: 0, 12: 0}),
    (0.999, {1: 0, 2: 1, 12: 11}),
])
def test_bf16_last_fraction_counts_whole_blocks_rounded_down(fraction, last):
    policy = PrecisionPolicy.mxfp4(SR, bf16_last_fraction=fraction)
    for blocks, count in last.items():
        assert policy.bf16_last_count(blocks) == count
        assert _recipes(policy, blocks)["mlp"] == [SR] * (blocks - count) + [None] * count


def test_bf16_last_blocks_and_fraction_take_the_larger():
    policy = PrecisionPolicy.mxfp4(SR, bf16_last_blocks=2, bf16_last_fraction=1 / 3)
    assert [policy.bf16_last_count(n) for n in (3, 6, 9, 12)] == [2, 2, 3, 4]


def test_first_and_last_blocks_run_bf16():
    policy = PrecisionPolicy.mxfp4(SR, bf16_first_blocks=1, bf16_last_blocks=2)
    want = [None, SR, SR, SR, None, None]
    assert _recipes(policy, 6)["attention"] == want and _recipes(policy, 6)["mlp"] == want
    # More BF16 blocks than the model has: every block BF16, the rest of the policy unchanged.
    assert _recipes(policy, 2) == {"attention": [None] * 2, "mlp": [None] * 2, "lm_head": None, "embedding": None}


def test_policy_is_static_and_hashable():
    a, b = PrecisionPolicy.mxfp4(bf16_last_blocks=2), PrecisionPolicy.mxfp4(bf16_last_blocks=2)
    assert a == b and hash(a) == hash(b) and a != PrecisionPolicy.mxfp4()
    calls = []

    @jax.jit(static_argnames="policy")
    def f(x, policy):
        calls.append(policy)
        return x + 1

    f(jnp.ones(2), policy=a)
    f(jnp.ones(2), policy=b)  # an equal policy reuses the trace
    assert len(calls) == 1


def test_uses_stochastic_rounding():
    assert not PrecisionPolicy.mxfp4().uses_stochastic_rounding
    assert PrecisionPolicy.mxfp4(SR).uses_stochastic_rounding
    assert PrecisionPolicy(lm_head=SR).uses_stochastic_rounding
    assert not PrecisionPolicy.bf16().uses_stochastic_rounding


@pytest.mark.parametrize("make, error, message", [
    (lambda: PrecisionPolicy(linear="mxfp4"), TypeError, "^linear must be an Mxfp4Recipe, an Fp8Recipe or None"),
    (lambda: PrecisionPolicy(lm_head=1), TypeError, "^lm_head must be"),
    (lambda: PrecisionPolicy(embedding=object()), TypeError, "^embedding must be"),
    (lambda: PrecisionPolicy(bf16_first_blocks=-1), ValueError, "^bf16_first_blocks must be >= 0, got -1"),
    (lambda: PrecisionPolicy(bf16_last_blocks=1.0), TypeError, "^bf16_last_blocks must be an int"),
    (lambda: PrecisionPolicy(bf16_last_blocks=True), TypeError, "^bf16_last_blocks must be an int"),
    (lambda: PrecisionPolicy.mxfp4("default"), TypeError, "^recipe must be an Mxfp4Recipe"),
    (lambda: PrecisionPolicy.mxfp4(Fp8Recipe()), TypeError, "^recipe must be an Mxfp4Recipe"),
    (lambda: PrecisionPolicy.fp8(Mxfp4Recipe()), TypeError, "^recipe must be an Fp8Recipe"),
    (lambda: PrecisionPolicy.fp8(embedding="yes"), TypeError, "^embedding must be a bool"),
    (lambda: PrecisionPolicy.mxfp4(lm_head=1), TypeError, "^lm_head must be a bool"),
    (lambda: PrecisionPolicy.mxfp4(bf16_last_blocks=-2), ValueError, "^bf16_last_blocks"),
    (lambda: PrecisionPolicy(bf16_last_fraction=1.0), ValueError, r"^bf16_last_fraction must be in \[0, 1\), got 1.0"),
    (lambda: PrecisionPolicy(bf16_last_fraction=-0.1), ValueError, "^bf16_last_fraction must be in"),
    (lambda: PrecisionPolicy(bf16_last_fraction="1/3"), TypeError, "^bf16_last_fraction must be a float"),
    (lambda: PrecisionPolicy.mxfp4(bf16_last_fraction=True), TypeError, "^bf16_last_fraction must be a float"),
    (lambda: PrecisionPolicy.mxfp4().bf16_last_count(0), ValueError, "^blocks must be a positive int, got 0"),
    (lambda: PrecisionPolicy.bf16().recipe_for("head"), ValueError, "^role must be one of"),
    (lambda: PrecisionPolicy.bf16().recipe_for("mlp"), TypeError, "^block must be an int for role 'mlp'"),
    (lambda: PrecisionPolicy.bf16().recipe_for("mlp", 0), TypeError, "^blocks must be an int"),
    (lambda: PrecisionPolicy.bf16().recipe_for("attention", 2, 2), ValueError, r"^block must be in \[0, blocks = 2\)"),
    (lambda: PrecisionPolicy.bf16().recipe_for("attention", -1, 2), ValueError, "^block must be in"),
    (lambda: PrecisionPolicy.bf16().recipe_for("lm_head", 0, 2), ValueError, "is not inside a block"),
    (lambda: PrecisionPolicy(quantize_weights_once=1), TypeError, "^quantize_weights_once must be a bool"),
])
def test_validation_names_the_argument(make, error, message):
    with pytest.raises(error, match=message):
        make()


def _operands(seed=0, m=48, n=64, k=128):
    kx, kw = jax.random.split(jax.random.key(seed))
    return (jax.random.normal(kx, (m, k)).astype(jnp.bfloat16), jax.random.normal(kw, (n, k)).astype(jnp.bfloat16))


def test_project_dispatches_by_recipe():
    x, w = _operands()
    np.testing.assert_array_equal(np.asarray(project(x, w, None)), np.asarray(gemm(x, w)))
    recipe = Mxfp4Recipe(fprop_hadamard=16)
    np.testing.assert_array_equal(np.asarray(project(x, w, recipe)), np.asarray(gemm_fp4_bf16(x, w, recipe)))
    key = jax.random.key(3)
    np.testing.assert_array_equal(np.asarray(project(x, w, SR, key=key)),
                                  np.asarray(gemm_fp4_bf16(x, w, SR, key=key)))
    fp8 = Fp8Recipe(gradient_format="float8_e4m3fn")
    np.testing.assert_array_equal(np.asarray(project(x, w, fp8, key=key)), np.asarray(gemm_fp8(x, w, fp8)))
    with pytest.raises(ValueError, match="^key"):
        project(x, w, SR)
    with pytest.raises(TypeError, match="^recipe must be"):
        project(x, w, "mxfp4")


def test_embedding_as_one_hot_gemm_is_a_lookup_in_the_quantized_table():
    # One-hot rows are exact in MXFP4 (a block holding a single 1.0 gets scale 2^-2 and code 4.0), and the default
    # recipe has no fprop Hadamard, so each output row is the table's column for that token as MXFP4 quantizes the
    # table's transpose [dim, vocab] along the vocabulary: the oracle's round trip of that matrix.
    vocab, dim = 64, 128
    table = jax.random.normal(jax.random.key(5), (vocab, dim)).astype(jnp.bfloat16)
    tokens = jnp.array([[0, 5, 63, 5], [17, 2, 2, 40]])
    got = project(jax.nn.one_hot(tokens, vocab, dtype=jnp.bfloat16), table.T, Mxfp4Recipe.default())
    quantized = oracle.dequantize(*oracle.quantize(np.asarray(table.T, np.float32)))  # [dim, vocab]
    np.testing.assert_array_equal(np.asarray(got, np.float32), quantized.T[np.asarray(tokens)])


# (policy, its MXFP4 projections in the tiny model, weight casts when made ahead)
WEIGHTS_ONCE_CASES = {
    # Both blocks (a third of 2 is no block), keyed Hadamard on wgrad only: widths K = 128 and w_down's 256.
    "default": (PrecisionPolicy.mxfp4(), 12, 2),
    # The head is K = 128 too; the embedding's table [dim, vocab] is K = 64.
    "every-projection": (PrecisionPolicy.mxfp4(Mxfp4Recipe.default(), lm_head=True, embedding=True,
                                               bf16_last_fraction=0.0), 14, 3),
    # Rotated weight copies cannot share a cast: one per projection of the one MXFP4 block.
    "rotated-weights": (PrecisionPolicy.mxfp4(Mxfp4Recipe(dgrad_hadamard=16, gradient_stochastic=True),
                                              bf16_first_blocks=1), 6, 6),
}


@pytest.mark.parametrize("case", WEIGHTS_ONCE_CASES)
def test_quantize_weights_once_gives_the_same_bits_with_fewer_weight_casts(case):
    """The functional model with quantize_weights_once: loss and gradients are the bytes of casting in every
    projection, and the weight casts drop from one per MXFP4 projection to one per weight width where the recipe
    rounds weights to nearest unrotated."""
    from jax_aiter.examples import tiny_llama

    policy, projections, ahead = WEIGHTS_ONCE_CASES[case]
    cfg = tiny_llama.Config()
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    tokens = tiny_llama.make_batch(cfg, jax.random.key(1))
    once = dataclasses.replace(policy, quantize_weights_once=True)

    def loss_and_grads(params, policy):
        return jax.value_and_grad(tiny_llama.loss_fn)(params, tokens, cfg, policy, key=jax.random.key(2))

    with jax_aiter.use_backend("xla"):
        casts = [cast_calls(jax.make_jaxpr(loss_and_grads, static_argnums=1)(params, p).jaxpr) for p in (policy, once)]
        want, got = (jax.jit(loss_and_grads, static_argnums=1)(params, p) for p in (policy, once))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert casts[1] == casts[0] - projections + ahead

# --- PrecisionSchedule ---------------------------------------------------------------------------------------


def test_schedule_phases():
    mxfp4, fp8 = PrecisionPolicy.mxfp4(), PrecisionPolicy.fp8()
    closing = PrecisionSchedule(mxfp4, fp8, 0.25)
    # 8 steps: round(8 * 0.25) = 2 closing steps, the last two.
    assert closing.final_from(8) == 6
    assert [closing.policy_at(t, 8) for t in range(8)] == [mxfp4] * 6 + [fp8] * 2
    assert closing.policies == (mxfp4, fp8)
    single = PrecisionSchedule(mxfp4)
    assert single.final_from(8) == 8 and single.policies == (mxfp4,)
    assert {single.policy_at(t, 8) for t in range(8)} == {mxfp4}
    assert hash(closing) == hash(PrecisionSchedule(PrecisionPolicy.mxfp4(), PrecisionPolicy.fp8(), 0.25))


def test_mxfp4_then_fp8_is_the_measured_arm():
    """The named schedule is the convergence arm whose H200 result docs/convergence.md records."""
    from jax_aiter.examples import convergence

    schedule = PrecisionSchedule.mxfp4_then_fp8()
    assert schedule.policy == PrecisionPolicy.mxfp4(Mxfp4Recipe(hadamard_seed=0), bf16_last_blocks=2,
                                                    bf16_last_fraction=0)
    assert schedule.final_policy == PrecisionPolicy.fp8() and schedule.final_fraction == 0.25
    assert convergence.ARMS["mxfp4-signed-hadamard-bf16-last2-then-fp8-last25"].schedule == schedule
    assert schedule.final_from(2000) == 1500
    custom = PrecisionSchedule.mxfp4_then_fp8(SR, bf16_last_blocks=0, final_fraction=0.1)
    assert custom.policy == PrecisionPolicy.mxfp4(SR, bf16_last_fraction=0) and custom.final_from(2000) == 1800


def test_default_mxfp4_policy_is_the_measured_arm():
    """On the 75 M model's 12 blocks the default policy is the static arm whose H200 result docs/convergence.md
    records (keyed signs, the last 4 blocks BF16); the old default is the arm mxfp4-every-block."""
    from jax_aiter.examples import convergence

    measured = convergence.ARMS["mxfp4-signed-hadamard-bf16-last4"].policy
    assert _recipes(PrecisionPolicy.mxfp4(), 12) == _recipes(measured, 12)
    assert convergence.ARMS["mxfp4"].policy == PrecisionPolicy.mxfp4()
    assert _recipes(convergence.ARMS["mxfp4-every-block"].policy, 12)["mlp"] == [Mxfp4Recipe.default()] * 12


@pytest.mark.parametrize("make, error, message", [
    (lambda: PrecisionSchedule("mxfp4"), TypeError, "policy must be a PrecisionPolicy, got str"),
    (lambda: PrecisionSchedule(PrecisionPolicy.mxfp4(), Fp8Recipe.default(), 0.1), TypeError,
     "final_policy must be a PrecisionPolicy or None, got Fp8Recipe"),
    (lambda: PrecisionSchedule(PrecisionPolicy.mxfp4(), None, 0.1), ValueError,
     "final_fraction must be 0 without a final_policy, got 0.1"),
    (lambda: PrecisionSchedule(PrecisionPolicy.mxfp4(), PrecisionPolicy.fp8(), 1.0), ValueError,
     r"final_fraction must be in \(0, 1\) with a final_policy, got 1.0"),
    (lambda: PrecisionSchedule.mxfp4_then_fp8().final_from(2), ValueError,
     "final_fraction 0.25 of 2 steps leaves a phase without steps"),
    (lambda: PrecisionSchedule.mxfp4_then_fp8().final_from(0), ValueError, "steps must be a positive int, got 0"),
    (lambda: PrecisionSchedule.mxfp4_then_fp8().policy_at(8, 8), ValueError,
     r"step must be an int in \[0, steps = 8\), got 8"),
])
def test_schedule_validation_names_the_argument(make, error, message):
    with pytest.raises(error, match=message):
        make()
