"""Reference attention on the CPU: the sequence-major form (main eb97793) and the committed one beside
jax.nn.dot_product_attention(implementation="xla"), bf16, B 2, S 1024, Hq 8, Hk 2, D 64, causal; best of 5.
    git show eb97793:jax_aiter/ref/mha.py > /tmp/old_mha.py && python3 cpu_ref_attn.py /tmp/old_mha.py"""
import os, sys, time
import jax, jax.numpy as jnp
import importlib.util
from jax_aiter.ref import mha as committed_mha

spec = importlib.util.spec_from_file_location("old_mha", sys.argv[1])
old_mha = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_mha)

B, S, H, HK, D = 2, 1024, 8, 2, 64
ks = jax.random.split(jax.random.key(0), 4)
q, k, v, do = (jax.random.normal(kk, s, jnp.bfloat16) for kk, s in
               zip(ks, [(B, S, H, D), (B, S, HK, D), (B, S, HK, D), (B, S, H, D)]))

def ref(mod):
    return lambda q, k, v: mod.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None,
                                         softmax_scale=D ** -0.5, window=(-1, 0), dropout_p=0.0)[0]

def best(f, *a):
    jax.block_until_ready(f(*a))
    times = []
    for _ in range(5):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); times.append(time.perf_counter() - t)
    return min(times) * 1e3

for name, f in [("sequence-major (eb97793)", ref(old_mha)), ("committed", ref(committed_mha)),
                ("jax.nn xla", lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                            implementation="xla"))]:
    def fwd_bwd(q, k, v, do, f=f):
        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(do))
    print(f"{name}: fwd {best(jax.jit(f), q, k, v):.1f} ms, fwd+bwd {best(jax.jit(fwd_bwd), q, k, v, do):.1f} ms",
          flush=True)
