"""Which part of the benchmark's BF16 step trips `IndexError: raw_hash_map::at` under
xla_gpu_exclude_nondeterministic_ops (ahead-of-time compile with the option): the loss, its gradient, each
parameter group's gradient, the full step; run once with the default backends and once with JAX_AITER_BACKEND=xla
(reference attention, XLA GEMMs) in the environment."""
import dataclasses, os
import numpy as np
import jax, jax.numpy as jnp
from jax_aiter.examples import convergence, tiny_llama
from jax_aiter.precision import PrecisionPolicy

OPT = {"xla_gpu_exclude_nondeterministic_ops": True}
setup = convergence.Setup.for_model("75m")
setup = dataclasses.replace(setup, config=dataclasses.replace(setup.config, layers=1, batch=4))
cfg = setup.config
tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (cfg.batch, cfg.seq_len + 1)), jnp.int32)
params = tiny_llama.init_params(cfg, jax.random.key(0))
opt = tiny_llama.adam_init(params)
policy = PrecisionPolicy.bf16()
loss = lambda p: convergence._text_loss(p, tokens, cfg, policy, jax.random.key(0))
def grad_of(name):
    def f(sub):
        return jax.grad(lambda s: loss({**params, name: s}))(sub)
    return f, params[name]
cases = {"loss": (loss, params), "grad": (jax.grad(loss), params)}
for name in params:
    cases[f"grad {name}"] = grad_of(name)
step = convergence.make_step(setup, policy, jax.random.key(1))
cases["full step"] = (lambda p, o: step(p, o, tokens), params, opt)
tag = os.environ.get("JAX_AITER_BACKEND", "default")
for name, (fn, *args) in cases.items():
    try:
        jax.jit(fn).trace(*args).lower().compile(compiler_options=OPT)
        print(f"[{tag}] {name}: ok", flush=True)
    except Exception as e:
        print(f"[{tag}] {name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
