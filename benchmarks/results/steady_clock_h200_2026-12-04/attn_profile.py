import json, sys
sys.path.insert(0, "benchmarks")
import jax, jax.numpy as jnp
from train_step_profile import kernel_times
from jax_aiter import benchmark as B
from jax_aiter.mha import flash_attn_func, flash_attn_varlen
res = {}
for hk in (32, 8):
    b, s, h, d = 4, 4096, 32, 128
    q = B.normal(jax.random.key(0), (b, s, h, d)); k = B.normal(jax.random.key(1), (b, s, hk, d))
    v = B.normal(jax.random.key(2), (b, s, hk, d)); do = B.normal(jax.random.key(3), (b, s, h, d))
    cu = jnp.arange(b + 1, dtype=jnp.int32) * s
    flat = lambda t: t.reshape(b * s, *t.shape[2:])
    fns = {"cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"),
           "default": lambda q, k, v: flash_attn_func(q, k, v, causal=True),
           "unguarded": B._unguarded_cudnn,
           "varlen": lambda q, k, v: flash_attn_varlen(flat(q), flat(k), flat(v), cu, cu, s, s, causal=True).reshape(q.shape)}
    comp = {}
    for n, fn in fns.items():
        def prog(a, fn=fn):
            out, vjp = jax.vjp(fn, *a[:3]); return (out, *vjp(a[3]))
        comp[n] = B.compile_fn(prog, (q, k, v, do))
    args = (q, k, v, do)
    t = B.timed_together(comp, args, 9, 3)
    for n, c in comp.items():
        kt = kernel_times(lambda *a, c=c: c(a), args)
        res[f"{n}_hk{hk}"] = dict(ms=t[n] * 1e3, **kt)
        print(f"hk{hk} {n}: {t[n]*1e3:.3f} ms (cudnn/this {t['cudnn']/t[n]:.3f}) kernels {kt['kernel_ms']:.3f} span {kt['span_ms']:.3f}")
        for kk in kt["kernels"][:14]:
            print(f"   {kk['us']:9.1f} us {kk['calls']:5.1f}x {kk['name'][:140]}")
    if hk == 32:
        open(f"{sys.argv[1]}/attn_default_hlo.txt", "w").write(comp["default"].as_text())
        open(f"{sys.argv[1]}/attn_varlen_hlo.txt", "w").write(comp["varlen"].as_text())
json.dump(res, open(f"{sys.argv[1]}/attn_profile.json", "w"), indent=1)
