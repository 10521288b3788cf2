"""CPU: each memory-bound op's default (this project's C++ kernel where selected) against plain XLA (the op under
use_backend("xla")), one process, batches interleaved (jax_aiter.benchmark.timed_together), 4 inputs per call."""
import json, sys, functools
import jax, jax.numpy as jnp
import jax_aiter
from jax_aiter import activation, gemm_fp4, rmsnorm
from jax_aiter.benchmark import timed_together, compile_fn, normal

def forced(fn, backend):
    def run(*a):
        with jax_aiter.use_backend(backend):
            return fn(*a)
    return run

M, K = 4096, 4096
ops = {
    "rms_norm fwd": (lambda x, r, g: rmsnorm.rms_norm(x, g, 1e-6), False),
    "add+rms_norm fwd": (lambda x, r, g: rmsnorm.rms_norm_with_add(x, r, g, 1e-6), False),
    "rms_norm fwd+bwd": (lambda x, r, g: rmsnorm.rms_norm(x, g, 1e-6), True),
    "add+rms_norm fwd+bwd": (lambda x, r, g: rmsnorm.rms_norm_with_add(x, r, g, 1e-6), True),
    "silu_and_mul fwd": (lambda x, r, g: activation.silu_and_mul(jnp.concatenate([x, r], -1)), False),
    "silu_and_mul fwd+bwd": (lambda x, r, g: activation.silu_and_mul(jnp.concatenate([x, r], -1)), True),
    "cast rowwise": (lambda x, r, g: gemm_fp4.cast_mxfp4(x), False),
    "cast dual": (lambda x, r, g: gemm_fp4.cast_mxfp4_dual(x), False),
    "cast dual h16 gemm layouts": (lambda x, r, g: gemm_fp4.cast_mxfp4_dual(
        x, hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="gemm_b"), False),
    "cast dual sr": (lambda x, r, g: gemm_fp4.cast_mxfp4_dual(x, sr_key=1234), False),
}
inputs = [(normal(jax.random.key(i), (M, K)), normal(jax.random.key(100 + i), (M, K)),
           normal(jax.random.key(200 + i), (K,), 0.5) + 1) for i in range(4)]
res = {}
for name, (fn, backward) in ops.items():
    progs = {}
    for impl in ("xla", "default"):
        f = forced(fn, "xla") if impl == "xla" else fn
        if backward:
            def prog(args_list, f=f):
                outs = []
                for x, r, g in args_list:
                    y, vjp = jax.vjp(f, x, r, g)
                    outs.append(vjp(jax.tree.map(jnp.ones_like, y)))
                return outs
        else:
            prog = lambda args_list, f=f: [f(*a) for a in args_list]
        progs[impl] = compile_fn(prog, inputs)
    t = timed_together({k: functools.partial(lambda a, p: p(a), p=p) for k, p in progs.items()}, inputs, 5, calls=2,
                       per_call=4)
    res[name] = dict(xla_ms=t["xla"] * 1e3, default_ms=t["default"] * 1e3, default_vs_xla=t["xla"] / t["default"])
    print(f"{name:28s} xla {t['xla']*1e3:8.2f} ms  default {t['default']*1e3:8.2f} ms  default/xla {t['xla']/t['default']:.2f}x", flush=True)
    json.dump(res, open(sys.argv[1], "w"), indent=1)
