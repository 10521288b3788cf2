"""fwd+bwd of flash_attn_func / flash_attn_varlen defaults (cuDNN + the non-finite handling) beside cuDNN itself
and our adapter without it, interleaved in one process (B4 S4096 Hq32 D128 causal, Hk 32 and 8)."""
import json, os
import jax, jax.numpy as jnp
from jax_aiter.benchmark import timed_together, _unguarded_cudnn, normal
from jax_aiter.mha import flash_attn_func, flash_attn_varlen

B, S, H, D = 4, 4096, 32, 128
rows = []
for HK in (H, H // 4):
    q = normal(jax.random.key(0), (B, S, H, D)); k = normal(jax.random.key(1), (B, S, HK, D))
    v = normal(jax.random.key(2), (B, S, HK, D)); do = normal(jax.random.key(3), (B, S, H, D))
    cu = jnp.arange(B + 1, dtype=jnp.int32) * S
    flat = lambda t: t.reshape(B * S, *t.shape[2:])
    fns = {
        "default": lambda q, k, v: flash_attn_func(q, k, v, causal=True),
        "varlen default": lambda q, k, v: flash_attn_varlen(flat(q), flat(k), flat(v), cu, cu, S, S,
                                                            causal=True).reshape(q.shape),
        "no finite handling": _unguarded_cudnn,
        "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"),
    }
    def program(fn):
        def run(a):
            out, vjp = jax.vjp(fn, *a[:3]); return (out, *vjp(a[3]))
        return jax.jit(run)
    times = timed_together({n: program(f) for n, f in fns.items()}, (q, k, v, do), batches=15, calls=5)
    for n, t in times.items():
        rows.append(dict(hk=HK, name=n, ms=t * 1e3, cudnn_over_this=times["cudnn"] / t))
        print(rows[-1], flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "attn_guard.json"), "w"), indent=1)
