"""One call of each dual-cast variant at 16384 x 4096 bf16, for ncu's per-instruction counts."""
import jax, jax.numpy as jnp
from jax_aiter import gemm_fp4
x = jax.random.normal(jax.random.key(0), (16384, 4096), jnp.float32).astype(jnp.bfloat16)
fns = {
    "dual": jax.jit(lambda x: gemm_fp4.cast_mxfp4_dual(x)),
    "h16": jax.jit(lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise="gemm_a",
                                                       layout_columnwise="gemm_b")),
    "sr": jax.jit(lambda x: gemm_fp4.cast_mxfp4_dual(x, sr_key=1234)),
}
for name, fn in fns.items():
    jax.block_until_ready(fn(x))
    print(name, "ok", flush=True)
