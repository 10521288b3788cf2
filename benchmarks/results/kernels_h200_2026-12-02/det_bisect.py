"""Which op of the training step fails to compile under xla_gpu_exclude_nondeterministic_ops? Each op's
forward + backward is compiled alone with the option, then the 75m train step for the bf16 and mxfp4 policies."""
import traceback
import jax, jax.numpy as jnp
from jax_aiter.gemm import gemm
from jax_aiter.gemm_fp4 import gemm_fp4_bf16, Mxfp4Recipe
from jax_aiter.gemm_fp8 import gemm_fp8, Fp8Recipe
from jax_aiter.rmsnorm import rms_norm_with_add
from jax_aiter.activation import silu_and_mul
from jax_aiter.mha import flash_attn_func
from jax_aiter.examples import tiny_llama, models
from jax_aiter.precision import PrecisionPolicy

OPT = {"xla_gpu_exclude_nondeterministic_ops": True}
bf = jnp.bfloat16
k = jax.random.key(0)
x = jax.random.normal(k, (4096, 768), bf); w = jax.random.normal(k, (2048, 768), bf)
q = jax.random.normal(k, (2, 1024, 12, 64), bf); kv = jax.random.normal(k, (2, 1024, 3, 64), bf)
g = jnp.ones((768,), bf); h = jax.random.normal(k, (4096, 4096), bf)
tok = jax.random.randint(k, (4, 1024), 0, 256)
table = jax.random.normal(k, (256, 768), bf)

def grad_of(f, *a):
    return lambda *a: jax.grad(lambda *a: f(*a).astype(jnp.float32).sum(), argnums=tuple(range(len(a))))(*a)

cases = {
    "gemm": (grad_of(gemm, x, w), (x, w)),
    "gemm_fp4_bf16": (grad_of(lambda x, w: gemm_fp4_bf16(x, w, Mxfp4Recipe.default()), x, w), (x, w)),
    "gemm_fp8": (grad_of(lambda x, w: gemm_fp8(x, w, Fp8Recipe.default()), x, w), (x, w)),
    "rmsnorm": (grad_of(lambda x, r: rms_norm_with_add(x, r, g, 1e-6)[0], x, x), (x, x)),
    "silu_and_mul": (grad_of(silu_and_mul, h), (h,)),
    "flash_attn causal": (grad_of(lambda q, k, v: flash_attn_func(q, k, v, causal=True), q, kv, kv), (q, kv, kv)),
    "embedding gather": (lambda t, i: jax.grad(lambda t: t[i].astype(jnp.float32).sum())(t), (table, tok)),
}
for name, (fn, args) in cases.items():
    try:
        jax.jit(fn).trace(*args).lower().compile(compiler_options=OPT)(*args)
        print(f"{name}: ok", flush=True)
    except Exception as e:
        print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)

import dataclasses
cfg = dataclasses.replace(models.MODELS["75m"].config, batch=4, layers=2)
params = tiny_llama.init_params(cfg, k)
opt = tiny_llama.adam_init(params)
for pname, policy in (("bf16", PrecisionPolicy.bf16()), ("mxfp4", PrecisionPolicy.mxfp4())):
    step = tiny_llama.make_train_step(cfg, policy)
    try:
        step.trace(params, opt, k).lower().compile(compiler_options=OPT)(params, opt, k)
        print(f"train step {pname}: ok", flush=True)
    except Exception as e:
        print(f"train step {pname}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
