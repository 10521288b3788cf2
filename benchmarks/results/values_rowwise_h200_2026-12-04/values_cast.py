"""Rotated dual casts timed in one program per variant (8 inputs per call): where the values layout's time goes."""
import json, sys, time, statistics
import jax, jax.numpy as jnp
from jax_aiter import gemm_fp4
out = sys.argv[1]
def v(row, col):
    return lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise=row, layout_columnwise=col)
variants = {"packed/packed": v("gemm_a", "gemm_a"), "values/plain": v("values", "plain"),
            "values/values": v("values", "values"), "gemm_a/values": v("gemm_a", "values")}
res = {}
for m, k in [(16384, 768), (16384, 2048)]:
    xs = [jax.random.normal(jax.random.key(i), (m, k), jnp.float32).astype(jnp.bfloat16) for i in range(8)]
    for name, f in variants.items():
        fn = jax.jit(lambda xs: [f(x) for x in xs])
        jax.block_until_ready(fn(xs))
        samples = []
        for _ in range(7):
            t_end = time.perf_counter() + 0.2
            while time.perf_counter() < t_end: jax.block_until_ready(fn(xs))
            t0 = time.perf_counter()
            for _ in range(10): o = fn(xs)
            jax.block_until_ready(o)
            samples.append((time.perf_counter() - t0) / 80 * 1e6)
        res[f"{name} {m}x{k}"] = statistics.median(samples)
        print(f"{name:14s} {m}x{k}: {res[f'{name} {m}x{k}']:7.1f} us per cast", flush=True)
json.dump(res, open(f"{out}/values_cast.json", "w"), indent=1)
