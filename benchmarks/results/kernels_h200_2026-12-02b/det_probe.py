"""Does the convergence harness's own training step (1025-token windows: attention over 1024) compile and repeat
bit for bit under xla_gpu_exclude_nondeterministic_ops?  Variants: jit(compiler_options=...), with and without
donation, and lower().compile(compiler_options=...); bf16, mxfp4 and the combination's MXFP4 policy."""
import dataclasses, time, traceback, sys
import numpy as np
import jax, jax.numpy as jnp
from jax_aiter.examples import convergence, tiny_llama
from jax_aiter.precision import PrecisionPolicy
from jax_aiter.gemm_fp4 import Mxfp4Recipe

OPT = {"xla_gpu_exclude_nondeterministic_ops": True}
layers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
setup = convergence.Setup.for_model("75m")
setup = dataclasses.replace(setup, config=dataclasses.replace(setup.config, layers=layers))
cfg = setup.config
rng = np.random.default_rng(0)
batches = [jnp.asarray(rng.integers(0, 256, (cfg.batch, cfg.seq_len + 1)), jnp.int32) for _ in range(12)]
policies = {"bf16": PrecisionPolicy.bf16(), "mxfp4": PrecisionPolicy.mxfp4(),
            "signed-last2": PrecisionPolicy.mxfp4(Mxfp4Recipe(hadamard_seed=0), bf16_last_blocks=2)}

def run(step, n):
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    opt = tiny_llama.adam_init(params)
    losses, t = [], []
    for b in batches[:n]:
        t0 = time.perf_counter()
        params, opt, loss = step(params, opt, b)
        losses.append(float(loss)); t.append(time.perf_counter() - t0)
    return np.array(losses), float(np.median(t[2:])) * 1e3

for pname, policy in policies.items():
    fn = convergence.make_step(setup, policy, jax.random.key(1))
    variants = {
        "jit(compiler_options) donate": lambda: jax.jit(fn, donate_argnums=(0, 1), compiler_options=OPT),
        "jit(compiler_options)": lambda: jax.jit(fn, compiler_options=OPT),
        "jit plain": lambda: jax.jit(fn, donate_argnums=(0, 1)),
    }
    for vname, make in variants.items():
        if pname != "bf16" and vname != "jit(compiler_options) donate":
            continue
        try:
            a, ms_a = run(make(), 12)
            b, ms_b = run(make(), 12)
            same = bool(np.array_equal(a, b))
            first = int(np.argmax(a != b)) if not same else -1
            print(f"{pname} / {vname}: ok, {ms_a:.1f} ms/step; two runs bitwise equal: {same}"
                  f"{'' if same else f' (first differ at step {first}: {a[first]!r} vs {b[first]!r})'}", flush=True)
        except Exception as e:
            print(f"{pname} / {vname}: FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
            traceback.print_exc(limit=3)
