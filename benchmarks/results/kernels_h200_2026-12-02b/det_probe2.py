"""The harness's training step (2 layers of the 75m model, 1025-token windows) compiled for determinism two ways:
`jit(...).trace(...).lower().compile(compiler_options=...)` (mode aot) or plain jit with the option in XLA_FLAGS
(mode env, the flag set by the caller); two runs of 12 steps compared bit for bit."""
import dataclasses, sys, time, traceback
import numpy as np
import jax, jax.numpy as jnp
from jax_aiter.examples import convergence, tiny_llama
from jax_aiter.precision import PrecisionPolicy
from jax_aiter.gemm_fp4 import Mxfp4Recipe

mode = sys.argv[1]
OPT = {"xla_gpu_exclude_nondeterministic_ops": True}
setup = convergence.Setup.for_model("75m")
setup = dataclasses.replace(setup, config=dataclasses.replace(setup.config, layers=int(sys.argv[2])))
cfg = setup.config
rng = np.random.default_rng(0)
batches = [jnp.asarray(rng.integers(0, 256, (cfg.batch, cfg.seq_len + 1)), jnp.int32) for _ in range(12)]
policies = {"bf16": PrecisionPolicy.bf16(), "mxfp4": PrecisionPolicy.mxfp4(),
            "signed-last2": PrecisionPolicy.mxfp4(Mxfp4Recipe(hadamard_seed=0), bf16_last_blocks=2),
            "fp8": PrecisionPolicy.fp8()}
for pname, policy in policies.items():
    try:
        fn = convergence.make_step(setup, policy, jax.random.key(1))
        params = tiny_llama.init_params(cfg, jax.random.key(0))
        opt = tiny_llama.adam_init(params)
        jitted = jax.jit(fn, donate_argnums=(0, 1))
        step = jitted.trace(params, opt, batches[0]).lower().compile(compiler_options=OPT) if mode == "aot" else jitted
        runs = []
        for _ in range(2):
            p = tiny_llama.init_params(cfg, jax.random.key(0)); o = tiny_llama.adam_init(p)
            losses, t = [], []
            for b in batches:
                t0 = time.perf_counter(); p, o, loss = step(p, o, b); losses.append(float(loss)); t.append(time.perf_counter() - t0)
            runs.append((np.array(losses), np.median(t[2:]) * 1e3))
        (a, ms), (b, _) = runs
        same = bool(np.array_equal(a, b))
        print(f"{mode} {pname}: ok {ms:.1f} ms/step; bitwise equal: {same}"
              + ("" if same else f" (first at step {int(np.argmax(a != b))})"), flush=True)
    except Exception as e:
        print(f"{mode} {pname}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
