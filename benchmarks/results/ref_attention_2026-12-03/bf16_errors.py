"""Largest error of the reference against the float64 oracle of tests/test_mha.py, before (main 8b3c3e9) and now,
bf16 inputs without a mask (max |error| / max |oracle| per tensor). Run with tests/ on PYTHONPATH:
    git show 8b3c3e9:jax_aiter/ref/mha.py > /tmp/before_mha.py && python3 bf16_errors.py /tmp/before_mha.py"""
import importlib.util, sys
import jax, jax.numpy as jnp, numpy as np
from jax_aiter.ref import mha as committed_mha
from test_mha import oracle, oracle_grads

spec = importlib.util.spec_from_file_location("before_mha", sys.argv[1])
before_mha = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before_mha)
for B, S, H, HK, D in ((1, 512, 4, 4, 128), (1, 600, 4, 2, 64)):
    rng = np.random.default_rng(0)
    q, k, v, do = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
                   for s in [(B, S, H, D), (B, S, HK, D), (B, S, HK, D), (B, S, H, D)])
    q64, k64, v64, do64 = (np.asarray(x, np.float64) for x in (q, k, v, do))
    want, _, probs = oracle(q64, k64, v64)
    wanted = (want, *oracle_grads(q64, k64, v64, do64, probs)[:3])
    for name, mod in (("before", before_mha), ("now", committed_mha)):
        f = lambda q, k, v, mod=mod: mod.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None,
                                                   softmax_scale=D ** -0.5, window=(-1, -1), dropout_p=0.0)[0]
        out, vjp = jax.vjp(f, q, k, v)
        errors = [np.max(np.abs(np.asarray(got, np.float64) - w)) / np.max(np.abs(w))
                  for got, w in zip((out, *vjp(do)), wanted)]
        print(f"B {B}, S {S}, Hq {H}, Hk {HK}, D {D}, {name:6s}: " +
              ", ".join(f"{n} {e:.2e}" for n, e in zip(("out", "dq", "dk", "dv"), errors)))
