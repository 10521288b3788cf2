"""The reference attention (deterministic=True on CUDA) with its float32 products at other dot algorithms:
time of fwd+bwd beside XLA's and cuDNN's attention, and the difference to the HIGHEST reference."""
import json, os, statistics, time, types
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax_aiter.mha import flash_attn_func
import jax_aiter.ref.mha as refmha

def timed(f, args, n=5, calls=3):
    jax.block_until_ready(f(*args)); s = []
    for _ in range(n):
        t = time.perf_counter()
        for _ in range(calls): o = f(*args)
        jax.block_until_ready(o); s.append((time.perf_counter() - t) / calls)
    return statistics.median(s)

def with_precision(p):
    proxy = types.SimpleNamespace(**{n: getattr(lax, n) for n in dir(lax) if not n.startswith("__")})
    proxy.Precision = types.SimpleNamespace(HIGHEST=p)
    refmha.lax = proxy
    jax.clear_caches()

B, S, H, D = 4, 4096, 32, 128
res = []
for HK in (H, H // 4):
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (B, S, H, D), jnp.bfloat16)
    k = jax.random.normal(ks[1], (B, S, HK, D), jnp.bfloat16)
    v = jax.random.normal(ks[2], (B, S, HK, D), jnp.bfloat16)
    do = jax.random.normal(ks[3], (B, S, H, D), jnp.bfloat16)
    def fwdbwd(fn):
        def prog(q, k, v, do):
            o, vjp = jax.vjp(fn, q, k, v); return (o, *vjp(do))
        return jax.jit(prog)
    det = lambda q, k, v: flash_attn_func(q, k, v, causal=True, deterministic=True)
    base = None
    for name, p in (("ref HIGHEST", lax.Precision.HIGHEST), ("ref X6", lax.DotAlgorithmPreset.BF16_BF16_F32_X6),
                    ("ref X3", lax.DotAlgorithmPreset.BF16_BF16_F32_X3),
                    ("ref BF16x1", lax.DotAlgorithmPreset.BF16_BF16_F32)):
        with_precision(p)
        f = fwdbwd(det)
        try:
            t = timed(f, (q, k, v, do))
            outs = [np.asarray(x, np.float64) for x in f(q, k, v, do)]
            fw = jax.jit(det); tf = timed(fw, (q, k, v))
        except Exception as e:
            res.append(dict(hk=HK, name=name, error=str(e)[:300])); print(res[-1], flush=True); continue
        if base is None: base = outs
        err = [float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(outs, base)]
        ulps = [float(np.mean(a != b)) for a, b in zip(outs, base)]
        res.append(dict(hk=HK, name=name, ms=t * 1e3, fwd_ms=tf * 1e3, max_rel_err_vs_highest=err,
                        fraction_differing=ulps)); print(res[-1], flush=True)
    with_precision(lax.Precision.HIGHEST)
    for name, impl in (("xla", "xla"), ("cudnn", "cudnn")):
        fn = lambda q, k, v, impl=impl: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        t = timed(fwdbwd(fn), (q, k, v, do)); tf = timed(jax.jit(fn), (q, k, v))
        outs = [np.asarray(x, np.float64) for x in fwdbwd(fn)(q, k, v, do)]
        err = [float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(outs, base)]
        res.append(dict(hk=HK, name=name, ms=t * 1e3, fwd_ms=tf * 1e3, max_rel_err_vs_highest=err)); print(res[-1], flush=True)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "attn_prec.json"), "w"), indent=1)
