"""Reference attention on the CPU: the sequence-major form (main eb97793) and the committed one beside
jax.nn.dot_product_attention(implementation="xla"), bf16: B 2, S 1024, Hq 8, Hk 2, D 64, causal, and B 1, S 1024,
Hq 8, Hk 8, D 128, without a mask; best of 9.
    git show eb97793:jax_aiter/ref/mha.py > /tmp/old_mha.py && python3 cpu_ref_attn.py /tmp/old_mha.py"""
import os, sys, time
import jax, jax.numpy as jnp
import importlib.util
from jax_aiter.ref import mha as committed_mha

spec = importlib.util.spec_from_file_location("old_mha", sys.argv[1])
old_mha = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_mha)

def ref(mod, causal):
    return lambda q, k, v: mod.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None,
                                         softmax_scale=q.shape[-1] ** -0.5, window=(-1, 0 if causal else -1),
                                         dropout_p=0.0)[0]

def best(f, *a):
    jax.block_until_ready(f(*a))
    times = []
    for _ in range(9):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); times.append(time.perf_counter() - t)
    return min(times) * 1e3

for (B, S, H, HK, D), causal in (((2, 1024, 8, 2, 64), True), ((1, 1024, 8, 8, 128), False)):
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, s, jnp.bfloat16) for kk, s in
                   zip(ks, [(B, S, H, D), (B, S, HK, D), (B, S, HK, D), (B, S, H, D)]))
    print(f"B {B}, S {S}, Hq {H}, Hk {HK}, D {D}, {'causal' if causal else 'no mask'}")
    for name, f in [("sequence-major (eb97793)", ref(old_mha, causal)), ("committed", ref(committed_mha, causal)),
                    ("jax.nn xla", lambda q, k, v, c=causal: jax.nn.dot_product_attention(
                        q, k, v, is_causal=c, implementation="xla"))]:
        def fwd_bwd(q, k, v, do, f=f):
            o, vjp = jax.vjp(f, q, k, v)
            return (o, *vjp(do))
        print(f"  {name}: fwd {best(jax.jit(f), q, k, v):.1f} ms, "
              f"fwd+bwd {best(jax.jit(fwd_bwd), q, k, v, do):.1f} ms", flush=True)
