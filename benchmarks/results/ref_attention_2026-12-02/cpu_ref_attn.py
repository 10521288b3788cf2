"""Reference attention on the CPU: the sequence-major form (main eb97793) and the committed one beside
jax.nn.dot_product_attention(implementation="xla"), bf16, B 2, S 1024, Hq 8, Hk 2, D 64, causal; best of 5."""
import os, sys, time
import jax, jax.numpy as jnp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import old_mha, grouped_mha

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

for name, f in [("sequence-major (eb97793)", ref(old_mha)), ("committed", ref(grouped_mha)),
                ("jax.nn xla", lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                            implementation="xla"))]:
    def fwd_bwd(q, k, v, do, f=f):
        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(do))
    print(f"{name}: fwd {best(jax.jit(f), q, k, v):.1f} ms, fwd+bwd {best(jax.jit(fwd_bwd), q, k, v, do):.1f} ms",
          flush=True)
