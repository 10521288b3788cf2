import jax, jax.numpy as jnp, numpy as np
from jax_aiter import gemm_fp4
x = jax.random.normal(jax.random.key(0), (16384, 4096), jnp.float32).astype(jnp.bfloat16)
fns = {
 "rowwise": jax.jit(lambda x: gemm_fp4.cast_mxfp4(x)),
 "dual": jax.jit(lambda x: gemm_fp4.cast_mxfp4_dual(x)),
 "h16": jax.jit(lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise="gemm_a", layout_columnwise="gemm_b")),
 "sr": jax.jit(lambda x: gemm_fp4.cast_mxfp4_dual(x, sr_key=1234)),
}
for name, f in fns.items():
    jax.block_until_ready(f(x))
