"""Reference attention on the CPU, before (main 8b3c3e9) and now, beside jax.nn.dot_product_attention(
implementation="xla"), bf16, forward and forward+backward: without a mask (MHA, D 128; GQA, D 64; 2048 queries) and
causal. Each round times every form (best of 5 calls); the rounds interleave the forms, so that a slow spell of
the shared machine hits them alike; the log lists every round's time.
    git show 8b3c3e9:jax_aiter/ref/mha.py > /tmp/before_mha.py && python3 cpu_ref_attn.py /tmp/before_mha.py"""
import importlib.util, sys, time
import jax, jax.numpy as jnp
from jax_aiter.ref import mha as committed_mha

spec = importlib.util.spec_from_file_location("before_mha", sys.argv[1])
before_mha = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before_mha)
ROUNDS, CALLS = 5, 5

def ref(mod, causal):
    return lambda q, k, v: mod.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None,
                                         softmax_scale=q.shape[-1] ** -0.5, window=(-1, 0 if causal else -1),
                                         dropout_p=0.0)[0]

def best(f, *a):
    times = []
    for _ in range(CALLS):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); times.append(time.perf_counter() - t)
    return min(times) * 1e3

for (B, S, H, HK, D), causal in (((1, 1024, 8, 8, 128), False), ((2, 1024, 8, 2, 64), False),
                                 ((1, 2048, 8, 8, 64), False), ((2, 1024, 8, 2, 64), True)):
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, do = (jax.random.normal(kk, s, jnp.bfloat16) for kk, s in
                   zip(ks, [(B, S, H, D), (B, S, HK, D), (B, S, HK, D), (B, S, H, D)]))
    forms = {"before (8b3c3e9)": ref(before_mha, causal), "now": ref(committed_mha, causal),
             "jax.nn xla": lambda q, k, v, c=causal: jax.nn.dot_product_attention(q, k, v, is_causal=c,
                                                                                  implementation="xla")}
    programs = {}
    for name, f in forms.items():
        def fwd_bwd(q, k, v, do, f=f):
            o, vjp = jax.vjp(f, q, k, v)
            return (o, *vjp(do))
        programs[name] = (jax.jit(f), jax.jit(fwd_bwd))
        jax.block_until_ready(programs[name][0](q, k, v)), jax.block_until_ready(programs[name][1](q, k, v, do))
    times = {name: ([], []) for name in forms}
    for _ in range(ROUNDS):
        for name, (fwd, fwd_bwd) in programs.items():
            times[name][0].append(best(fwd, q, k, v))
            times[name][1].append(best(fwd_bwd, q, k, v, do))
    print(f"B {B}, S {S}, Hq {H}, Hk {HK}, D {D}, {'causal' if causal else 'no mask'} "
          f"(ms, best of {CALLS} per round, {ROUNDS} rounds)")
    for name, (fwd, fwd_bwd) in times.items():
        print(f"  {name:17s} fwd min {min(fwd):6.1f} [{' '.join(f'{t:.1f}' for t in fwd)}]   "
              f"fwd+bwd min {min(fwd_bwd):6.1f} [{' '.join(f'{t:.1f}' for t in fwd_bwd)}]", flush=True)
