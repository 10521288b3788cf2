"""jax_aiter.flax: each layer equals the functional ops on its parameters (eager, under jit, and in gradients),
stochastic-rounding keys, the inference workspace, FSDP sharding annotations on 8 virtual CPU devices, and the
demo model built from the layers."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

pytest.importorskip("flax", reason="Flax is not installed (pip install 'jax-aiter[flax]'); jax_aiter.flax needs it")

from flax import nnx  # noqa: E402

from _programs import cast_calls  # noqa: E402

import jax_aiter  # noqa: E402
from jax_aiter import flax as layers  # noqa: E402
from jax_aiter.activation import silu_and_mul  # noqa: E402
from jax_aiter.gemm import gemm  # noqa: E402
from jax_aiter.gemm_fp4 import Mxfp4Recipe, WeightWorkspace, gemm_fp4_bf16  # noqa: E402
from jax_aiter.gemm_fp8 import Fp8Recipe, gemm_fp8  # noqa: E402
from jax_aiter.precision import PrecisionPolicy, PrecisionSchedule  # noqa: E402
from jax_aiter.rmsnorm import rms_norm, rms_norm_with_add  # noqa: E402

MIXED = Mxfp4Recipe(activation_scale_rule="floor", fprop_hadamard=32, dgrad_hadamard=16, hadamard_seed=7)
SR = Mxfp4Recipe(activation_stochastic=True, gradient_stochastic=True)


def _x(shape, seed=0, dtype=jnp.bfloat16):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def _equal(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _bf16(w):
    return w.astype(jnp.bfloat16)


# --- each layer is the functional ops on its parameters ----------------------------------------------------


def test_linear_is_gemm_and_weight_layout():
    layer = layers.Linear(96, 64, rngs=nnx.Rngs(0))
    assert layer.weight.shape == (64, 96) and layer.weight.dtype == jnp.float32  # [out, in], float32 master
    x = _x((2, 5, 96))
    y = layer(x)
    assert y.shape == (2, 5, 64) and y.dtype == jnp.bfloat16
    _equal(y, gemm(x, _bf16(layer.weight[...])))
    # Default init: normal with variance 1/in_features.
    assert 0.8 < float(jnp.std(layer.weight[...]) * np.sqrt(96)) < 1.2


@pytest.mark.parametrize("recipe", [None, MIXED], ids=["default", "mixed"])
def test_mxfp4_linear_is_gemm_fp4_bf16(recipe):
    layer = layers.Mxfp4Linear(128, 64, recipe=recipe, rngs=nnx.Rngs(1))
    x = _x((3, 40, 128), seed=1)
    recipe = Mxfp4Recipe.default() if recipe is None else recipe
    _equal(layer(x), gemm_fp4_bf16(x, _bf16(layer.weight[...]), recipe))
    with pytest.raises(ValueError, match="multiples of 64"):
        layers.Mxfp4Linear(96, 64, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="^recipe"):
        layers.Mxfp4Linear(64, 64, recipe="default", rngs=nnx.Rngs(0))


def test_fp8_linear_and_swiglu_with_an_fp8_recipe_are_gemm_fp8():
    recipe = Fp8Recipe(gradient_format="float8_e4m3fn")
    layer = layers.Fp8Linear(96, 40, recipe=recipe, rngs=nnx.Rngs(5))
    x = _x((2, 8, 96), 5)
    _equal(layer(x), gemm_fp8(x, _bf16(layer.weight[...]), recipe))
    with pytest.raises(TypeError, match="^recipe"):
        layers.Fp8Linear(64, 64, recipe=Mxfp4Recipe(), rngs=nnx.Rngs(0))
    mlp = layers.SwiGLU(96, 64, recipe=recipe, rngs=nnx.Rngs(6))
    assert isinstance(mlp.gate_up, layers.Fp8Linear) and isinstance(mlp.down, layers.Fp8Linear)
    gate, up = jnp.split(gemm_fp8(x, _bf16(mlp.gate_up.weight[...]), recipe), 2, axis=-1)
    _equal(mlp(x), gemm_fp8(silu_and_mul(gate, up), _bf16(mlp.down.weight[...]), recipe))
    with pytest.raises(TypeError, match="^recipe"):
        layers.SwiGLU(96, 64, recipe="fp8", rngs=nnx.Rngs(0))


def test_rms_norm_with_and_without_residual():
    norm = layers.RMSNorm(64, epsilon=1e-5)
    norm.scale[...] = 1.0 + 0.1 * jnp.arange(64, dtype=jnp.float32)
    x, residual = _x((4, 64), 2), _x((4, 64), 3)
    gamma = _bf16(norm.scale[...])
    _equal(norm(x), rms_norm(x, gamma, 1e-5))
    _equal(norm(x, residual), rms_norm_with_add(x, residual, gamma, 1e-5))


@pytest.mark.parametrize("recipe", [None, Mxfp4Recipe.default()], ids=["bf16", "mxfp4"])
def test_swiglu_is_gate_up_silu_and_mul_down(recipe):
    mlp = layers.SwiGLU(64, 128, recipe=recipe, rngs=nnx.Rngs(3))
    assert mlp.gate_up.weight.shape == (256, 64) and mlp.down.weight.shape == (64, 128)
    assert isinstance(mlp.gate_up, layers.Mxfp4Linear) == (recipe is not None)
    x = _x((2, 32, 64), 4)
    if recipe is None:
        linear = gemm
    else:
        linear = functools.partial(gemm_fp4_bf16, recipe=recipe)
    gate, up = jnp.split(linear(x, _bf16(mlp.gate_up.weight[...])), 2, axis=-1)
    _equal(mlp(x), linear(silu_and_mul(gate, up), _bf16(mlp.down.weight[...])))


def _attention_by_hand(attn, x, linear=gemm):
    from jax_aiter.mha import flash_attn_func

    b, s, _ = x.shape
    hd = attn.head_dim
    q = linear(x, _bf16(attn.q_proj.weight[...])).reshape(b, s, attn.heads, hd)
    k = linear(x, _bf16(attn.k_proj.weight[...])).reshape(b, s, attn.kv_heads, hd)
    v = linear(x, _bf16(attn.v_proj.weight[...])).reshape(b, s, attn.kv_heads, hd)
    out = flash_attn_func(layers.rotary_embedding(q), layers.rotary_embedding(k), v, causal=True)
    return linear(out.reshape(b, s, attn.heads * hd), _bf16(attn.o_proj.weight[...]))


def test_attention_is_projections_rope_and_flash_attention_with_gqa():
    pytest.importorskip("jax_aiter.mha")
    attn = layers.Attention(128, heads=4, kv_heads=2, rngs=nnx.Rngs(5))
    assert (attn.q_proj.weight.shape, attn.k_proj.weight.shape, attn.o_proj.weight.shape) == (
        (128, 128), (64, 128), (128, 128))
    x = _x((2, 16, 128), 6)
    y = attn(x)
    _equal(y, _attention_by_hand(attn, x))
    # Causal: a change at the last position leaves earlier outputs alone.
    changed = attn(x.at[:, -1].add(1.0))
    _equal(changed[:, :-1], y[:, :-1])
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        layers.Attention(128, heads=4, kv_heads=3, rngs=nnx.Rngs(0))


# --- jit and grad --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", [None, Mxfp4Recipe.default()], ids=["bf16", "mxfp4"])
def test_jit_and_grad_equal_the_functional_ops(recipe):
    mlp = layers.SwiGLU(64, 128, recipe=recipe, rngs=nnx.Rngs(7))
    x = _x((2, 32, 64), 8)
    linear = gemm if recipe is None else functools.partial(gemm_fp4_bf16, recipe=recipe)

    def by_hand(w_gate_up, w_down, x):
        return linear(silu_and_mul(linear(x, _bf16(w_gate_up))), _bf16(w_down))

    _equal(nnx.jit(lambda m, x: m(x))(mlp, x), mlp(x))

    def loss(model, x):
        return jnp.sum(model(x).astype(jnp.float32) ** 2)

    grads = nnx.jit(nnx.grad(loss))(mlp, x)
    want = jax.jit(jax.grad(lambda a, b, x: jnp.sum(by_hand(a, b, x).astype(jnp.float32) ** 2), argnums=(0, 1)))(
        mlp.gate_up.weight[...], mlp.down.weight[...], x)
    _equal((grads.gate_up.weight[...], grads.down.weight[...]), want)
    assert grads.gate_up.weight.dtype == jnp.float32  # gradients come back in the master dtype


# --- stochastic rounding keys -------------------------------------------------------------------------------


def test_stochastic_rounding_keys_from_the_rngs_stream_or_explicit():
    layer = layers.Mxfp4Linear(64, 64, recipe=SR, rngs=nnx.Rngs(0, mxfp4=11))
    x = _x((64, 64), 9)
    w = _bf16(layer.weight[...])
    # An explicit key is used as given.
    _equal(layer(x, key=jax.random.key(3)), gemm_fp4_bf16(x, w, SR, key=jax.random.key(3)))
    # Without one, every call draws the next key of the "mxfp4" stream: two calls round differently, and a layer
    # built from the same seeds repeats the sequence, under nnx.jit too.
    first, second = layer(x), layer(x)
    assert np.any(np.asarray(first) != np.asarray(second))
    again = layers.Mxfp4Linear(64, 64, recipe=SR, rngs=nnx.Rngs(0, mxfp4=11))
    step = nnx.jit(lambda m, x: m(x))
    _equal((step(again, x), step(again, x)), (first, second))
    # A recipe without stochastic rounding keeps no stream.
    assert layers.Mxfp4Linear(64, 64, rngs=nnx.Rngs(0)).sr_rngs is None


# --- inference workspace -------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", [None, MIXED], ids=["default", "mixed"])
def test_workspace_serves_the_weight_copy_to_eager_inference(recipe):
    ws = WeightWorkspace()
    layer = layers.Mxfp4Linear(128, 64, recipe=recipe, param_dtype=jnp.bfloat16, workspace=ws, rngs=nnx.Rngs(2))
    x = _x((3, 40, 128), 10)
    want = gemm_fp4_bf16(x, layer.weight[...], layer.recipe)
    _equal(layer(x), want)  # the cached path computes the differentiable path's forward
    assert len(ws) == 1 and layer.weight[...] in ws
    copies = list(ws._entries.values())[0].copies
    layer(_x((3, 40, 128), 11))
    assert list(ws._entries.values())[0].copies is copies  # served, not requantized
    # A new weight (an optimizer step makes a new array) is requantized; the old entry goes with its array.
    layer.weight[...] = layer.weight[...] * 2
    _equal(layer(x), gemm_fp4_bf16(x, layer.weight[...], layer.recipe))
    assert len(ws) == 1 and list(ws._entries.values())[0].copies is not copies
    # Under grad the weight is traced: the differentiable path, nothing cached.
    grads = nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32)))(layer)
    assert grads.weight.shape == (64, 128) and len(ws) == 1


# --- FSDP on 8 virtual CPU devices ---------------------------------------------------------------------------


class _Block(nnx.Module):
    """Pre-norm attention + SwiGLU block, every projection MXFP4, weights annotated for FSDP."""

    def __init__(self, sharding, rngs):
        self.norm1 = layers.RMSNorm(256, rngs=rngs)
        self.attn = layers.Attention(256, heads=4, kv_heads=2, recipe=Mxfp4Recipe.default(), weight_sharding=sharding,
                                     rngs=rngs)
        self.norm2 = layers.RMSNorm(256, rngs=rngs)
        self.mlp = layers.SwiGLU(256, 512, recipe=Mxfp4Recipe.default(), weight_sharding=sharding, rngs=rngs)

    def __call__(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


def _train_step(graphdef, params, x):
    def loss(params):
        y = nnx.merge(graphdef, params)(x)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


@pytest.mark.multidevice
def test_fsdp_annotations_and_a_sharded_train_step_equal_the_unsharded_one():
    pytest.importorskip("jax_aiter.mha")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py forces 8 virtual CPU devices)")
    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    x = _x((8, 64, 256), 12)  # 512 tokens: 64 per device, whole blocks for the MXFP4 token rule

    plain = _Block(None, nnx.Rngs(0))
    graphdef, params = nnx.split(plain)
    want_loss, want_params = jax.jit(functools.partial(_train_step, graphdef))(params, x)

    with jax.set_mesh(mesh):
        sharded = _Block(("fsdp", None), nnx.Rngs(0))
    specs = nnx.get_partition_spec(nnx.state(sharded))
    assert specs.mlp.gate_up.weight.get_value() == P("fsdp", None)
    assert specs.attn.q_proj.weight.get_value() == P("fsdp", None)
    assert specs.norm1.scale.get_value() == P()
    weight = sharded.mlp.gate_up.weight[...]
    assert weight.sharding.spec == P("fsdp", None) and weight.addressable_shards[0].data.shape == (1024 // 8, 256)
    sharded_graphdef, sharded_params = nnx.split(sharded)
    _equal(sharded_params, params)  # the same initial values, only placed differently

    x_sharded = jax.device_put(x, NamedSharding(mesh, P("fsdp")))
    step = jax.jit(functools.partial(_train_step, sharded_graphdef)).lower(sharded_params, x_sharded).compile()
    # The MXFP4 weights travel as FP4 bytes (u8 all-gathers), never as bf16 (docs/mxfp4.md, "Sharding").
    assert "u8[1024,128]{1,0} all-gather(" in step.as_text()  # gate_up's FP4 data, gathered for fprop
    got_loss, got_params = step(sharded_params, x_sharded)
    # Updated weights stay FSDP-sharded.
    assert got_params.mlp.down.weight[...].sharding.spec == P("fsdp", None)
    # The loss is a float32 mean of n = x.size positive squares that the sharded program sums in another order:
    # the rounding errors of such a sum grow like sqrt(n) * 2^-24 relative (2.2e-5 here).
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=np.sqrt(x.size) * 2 ** -24)
    # Each weight moves by 0.1 * g. Every device holds one sequence, and the sharded wgrad sums the devices' bf16
    # partials g_i (each sequence's own gradient) in float32 (docs/mxfp4.md, "Sharding"), where the unsharded one
    # rounds one float32 sum to bf16: the two g differ by up to half a bf16 ulp of each g_i and of g, at most
    # 2^-8 * (sum_i |g_i| + |g|). The factor 2^-7 below doubles that for the float32 accumulations and for the
    # |g_i| being measured from bf16 results themselves; 2^-23 * |w| covers the float32 rounding of both updated
    # weights. Which elements land a bf16 step apart depends on the path's summation order (native or XLA).
    one_sequence_step = jax.jit(functools.partial(_train_step, graphdef))
    per_sequence = [one_sequence_step(params, x[i:i + 1])[1] for i in range(x.shape[0])]  # loss = its mean: 8 g_i
    leaves = [jax.tree.map(lambda v: np.asarray(v, np.float64), tree) for tree in (got_params, want_params, params)]
    for got, want, start, *alone in zip(*map(jax.tree.leaves, [*leaves, *per_sequence]), strict=True):
        move = start - want
        parts = sum(np.abs(start - np.asarray(a, np.float64)) for a in alone) / len(alone)
        bound = 2 ** -7 * (np.abs(move) + parts) + 2 ** -23 * np.abs(want)
        worst = np.argmax(np.abs(got - want) - bound)
        assert np.all(np.abs(got - want) <= bound), (got.flat[worst], want.flat[worst], bound.flat[worst])


@pytest.mark.parametrize("recipe", [Mxfp4Recipe.default(), MIXED], ids=["default", "rotated-weights"])
def test_weights_quantized_once_gives_the_layers_bits(recipe):
    """An attention layer's four projections and a SwiGLU inside weights_quantized_once, under nnx.jit and
    nnx.value_and_grad: the loss and every gradient are the bytes of the layers casting their own weights; the
    weight casts drop from six to two (K = 128: q, k, v, o, gate_up; K = 256: down) where the recipe allows, and
    the layers hold no copies afterwards."""
    pytest.importorskip("jax_aiter.mha")

    class Pair(nnx.Module):
        def __init__(self, rngs):
            self.attention = layers.Attention(128, 2, 1, causal=True, recipe=recipe, rngs=rngs)
            self.mlp = layers.SwiGLU(128, 256, recipe=recipe, rngs=rngs)

        def __call__(self, x):
            return self.mlp(self.attention(x))

    model = Pair(nnx.Rngs(0))
    x = _x((2, 64, 128), seed=3)

    def loss(model, once):
        if once:
            with layers.weights_quantized_once(model):
                return jnp.sum(jnp.square(model(x).astype(jnp.float32)))
        return jnp.sum(jnp.square(model(x).astype(jnp.float32)))

    step = nnx.jit(nnx.value_and_grad(loss), static_argnums=1)
    _equal(step(model, True), step(model, False))
    linears = [m for _, m in nnx.iter_modules(model) if isinstance(m, layers.Mxfp4Linear)]
    assert len(linears) == 6 and all(layer.weight_copies is None for layer in linears)
    graphdef, state = nnx.split(model)
    with jax_aiter.use_backend("xla"):
        casts = [cast_calls(jax.make_jaxpr(lambda state: loss(nnx.merge(graphdef, state), once))(state).jaxpr)
                 for once in (False, True)]
    assert casts[0] - casts[1] == (4 if recipe == Mxfp4Recipe.default() else 0)


def test_weights_quantized_once_lets_go_of_the_copies_on_an_error():
    layer = layers.Mxfp4Linear(128, 64, rngs=nnx.Rngs(0))
    with pytest.raises(ZeroDivisionError):
        with layers.weights_quantized_once(layer):
            assert layer.weight_copies is not None
            raise ZeroDivisionError
    assert layer.weight_copies is None


# --- the demo model ------------------------------------------------------------------------------------------


def test_demo_model_from_layers_equals_the_functional_definition():
    pytest.importorskip("jax_aiter.mha")
    from jax_aiter.examples import tiny_llama

    cfg = tiny_llama.Config(batch=2, seq_len=16, layers=3)
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    tokens = tiny_llama.make_batch(cfg, jax.random.key(1))
    policies = (PrecisionPolicy.bf16(), PrecisionPolicy.mxfp4(), PrecisionPolicy.mxfp4(MIXED, lm_head=True),
                PrecisionPolicy.mxfp4(embedding=True, bf16_first_blocks=1, bf16_last_blocks=1),
                PrecisionPolicy.fp8(lm_head=True),
                dataclasses.replace(PrecisionPolicy.mxfp4(lm_head=True, embedding=True), quantize_weights_once=True))
    logits = []
    for policy in policies:
        model = tiny_llama.TinyLlama(cfg, policy=policy, rngs=nnx.Rngs(0)).load(params)
        logits.append(model(tokens))
        _equal(logits[-1], tiny_llama.forward(params, tokens, cfg, policy))
    # Each policy changes the numerics, so each comparison above checked a different model.
    for i, a in enumerate(logits):
        for b in logits[i + 1:]:
            assert not np.array_equal(np.asarray(a), np.asarray(b))
    # The layers each policy builds: BF16 Linear where the policy says None, Mxfp4Linear with its recipe elsewhere.
    model = tiny_llama.TinyLlama(cfg, policy=policies[3], rngs=nnx.Rngs(0))
    assert isinstance(model.embed, layers.Mxfp4Linear) and model.embed.weight.shape == (cfg.dim, cfg.vocab)
    kinds = [type(block.mlp.down) for block in model.blocks]
    assert kinds == [layers.Linear, layers.Mxfp4Linear, layers.Linear]
    assert type(model.head) is layers.Linear
    fp8 = tiny_llama.TinyLlama(cfg, policy=policies[4], rngs=nnx.Rngs(0))
    assert isinstance(fp8.head, layers.Fp8Linear) and isinstance(fp8.blocks[0].attention.q_proj, layers.Fp8Linear)
    with pytest.raises(TypeError, match="^policy must be a PrecisionPolicy"):
        tiny_llama.TinyLlama(cfg, policy=Mxfp4Recipe.default(), rngs=nnx.Rngs(0))
    short = tiny_llama.Config(steps=3)
    assert tiny_llama.train(short, use_flax=True) == tiny_llama.train(short, use_flax=False)


def test_demo_training_takes_a_schedule_with_flax_and_without():
    pytest.importorskip("jax_aiter.mha")
    from jax_aiter.examples import tiny_llama

    cfg = tiny_llama.Config(steps=4, batch=2, seq_len=16)
    schedule = PrecisionSchedule(PrecisionPolicy.mxfp4(), PrecisionPolicy.fp8(), final_fraction=0.5)
    losses = tiny_llama.train(cfg, schedule, use_flax=True)
    assert losses == tiny_llama.train(cfg, schedule, use_flax=False)
    # The first half trains as the MXFP4 policy alone; the closing half's losses are FP8's, on those weights.
    alone = tiny_llama.train(cfg, PrecisionPolicy.mxfp4(), use_flax=True)
    assert losses[:2] == alone[:2] and losses[2] != alone[2] and losses[3] != alone[3]
    params = tiny_llama.init_params(cfg, jax.random.key(cfg.seed))
    opt_state = tiny_llama.adam_init(params)
    key = jax.random.key(cfg.seed)
    for i, policy in enumerate([PrecisionPolicy.mxfp4()] * 2 + [PrecisionPolicy.fp8()] * 2):
        step = tiny_llama.make_train_step(cfg, policy)
        params, opt_state, loss = step(params, opt_state, jax.random.fold_in(key, i))
        assert float(loss) == losses[i], i
    with pytest.raises(TypeError, match="^policy must be a PrecisionPolicy, a PrecisionSchedule or None"):
        tiny_llama.train(cfg, Mxfp4Recipe.default())
