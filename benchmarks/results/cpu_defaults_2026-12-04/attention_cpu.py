import json, sys, functools
import jax, jax.numpy as jnp
from jax_aiter.mha import flash_attn_func
from jax_aiter.benchmark import timed_together
res = {}
for (b, s, hq, hk, d) in [(2, 1024, 8, 8, 64), (2, 2048, 8, 2, 128), (1, 4096, 4, 4, 64)]:
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (b, s, hq, d), jnp.bfloat16)
    k = jax.random.normal(ks[1], (b, s, hk, d), jnp.bfloat16)
    v = jax.random.normal(ks[2], (b, s, hk, d), jnp.bfloat16)
    do = jax.random.normal(ks[3], (b, s, hq, d), jnp.bfloat16)
    fns = {"ours": lambda q, k, v: flash_attn_func(q, k, v, causal=True),
           "xla": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")}
    progs = {}
    for name, f in fns.items():
        fwd = jax.jit(f)
        bwd = jax.jit(lambda q, k, v, do, f=f: jax.vjp(f, q, k, v)[1](do))
        progs[name + " fwd"] = lambda a, fwd=fwd: fwd(*a[:3])
        progs[name + " fwd+bwd"] = lambda a, bwd=bwd: bwd(*a)
    t = timed_together(progs, (q, k, v, do), 5, calls=2)
    key = f"B{b} S{s} Hq{hq} Hk{hk} D{d}"
    res[key] = {n: v * 1e3 for n, v in t.items()}
    print(key, {n: round(v * 1e3, 2) for n, v in t.items()}, "fwd ours/xla %.2f  fwd+bwd %.2f" % (
        t["ours fwd"] / t["xla fwd"], t["ours fwd+bwd"] / t["xla fwd+bwd"]), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
