"""Casts timed inside one program (8 distinct inputs per call, no dispatch overhead), settled; one library per process."""
import json, os, sys, time, statistics
import jax, jax.numpy as jnp
from jax_aiter import gemm_fp4
out, label = sys.argv[1], sys.argv[2]
variants = {
    "rowwise": lambda x: gemm_fp4.cast_mxfp4(x, layout="gemm_a"),
    "dual": lambda x: gemm_fp4.cast_mxfp4_dual(x),
    "h16_x": lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="plain"),
    "h16_g": lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="gemm_a"),
    "h16_shuffled": lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="gemm_b"),
}
res = {}
for m, k in [(16384, 768), (16384, 2048), (16384, 4096)]:
    xs = [jax.random.normal(jax.random.key(i), (m, k), jnp.float32).astype(jnp.bfloat16) for i in range(8)]
    for name, f in variants.items():
        fn = jax.jit(lambda xs: [f(x) for x in xs])
        jax.block_until_ready(fn(xs))
        samples = []
        for _ in range(9):
            t_end = time.perf_counter() + 0.3
            while time.perf_counter() < t_end: jax.block_until_ready(fn(xs))
            t0 = time.perf_counter()
            for _ in range(10): o = fn(xs)
            jax.block_until_ready(o)
            samples.append((time.perf_counter() - t0) / 80 * 1e6)
        res[f"{name} {m}x{k}"] = statistics.median(samples)
        print(f"{label} {name:13s} {m}x{k}: {res[f'{name} {m}x{k}']:7.1f} us per cast", flush=True)
json.dump(res, open(f"{out}/cast_ab_{label}.json", "w"), indent=1)
