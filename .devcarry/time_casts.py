import time, json, sys
import jax, jax.numpy as jnp, numpy as np
from jax_aiter import gemm_fp4

def bench(f, *args, reps=20, batches=5):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(reps):
            r = f(*args)
        jax.block_until_ready(r)
        ts.append((time.perf_counter() - t) / reps)
    return float(np.median(ts))

big = jnp.zeros((1 << 30,), jnp.bfloat16)
copy = bench(jax.jit(lambda a: -a), big)
ceiling = 2 * big.size * 2 / copy
print(f"copy ceiling {ceiling/1e12:.2f} TB/s")
fns = {
 "rowwise": (lambda x: gemm_fp4.cast_mxfp4(x), 1),
 "dual": (lambda x: gemm_fp4.cast_mxfp4_dual(x), 2),
 "h16": (lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="gemm_b"), 2),
 "sr": (lambda x: gemm_fp4.cast_mxfp4_dual(x, sr_key=1234), 2),
}
res = {}
for m, k in ((16384, 4096), (8192, 8192), (16384, 14336)):
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32).astype(jnp.bfloat16)
    for name, (fn, copies) in fns.items():
        if name in ("h16", "sr") and (m, k) != (16384, 4096):
            continue
        t = bench(jax.jit(fn), x)
        n = m * k
        frac = (2 * n + copies * (n // 2 + n // 32)) / t / ceiling
        res[f"{name} {m}x{k}"] = (t * 1e6, frac)
        print(f"{name:8s} {m}x{k}: {t*1e6:8.1f} us  {frac:.2f} of copy", flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
