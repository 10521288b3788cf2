"""Casts timed inside one program (8 distinct inputs per call, no dispatch overhead), each program settled for 0.2 s
before each of its 5 batches; one library per process (argv: output folder, label). The shapes are the 75 M model's
(activations and gradients of 16384 tokens at widths 192 to 4096, weights of 192 to 2048 rows and columns) and a
few between, so that the tile count where 32-row tiles stop paying shows. Bytes: x read once, each copy's data and
scales written once ("values" copies: 2 bytes per element); the copy rate is measured in the same process."""
import json
import sys

import jax
import jax.numpy as jnp

from jax_aiter import gemm_fp4
from jax_aiter.benchmark import timed_together

out, label = sys.argv[1], sys.argv[2]
SR = 1234
variants = {  # name: (cast, bytes written per element)
    "dual": (lambda x: gemm_fp4.cast_mxfp4_dual(x, layout_rowwise="gemm_a", layout_columnwise="gemm_b"),
             2 * (0.5 + 1 / 32)),
    "h16_g": (lambda x: gemm_fp4.cast_mxfp4_dual(x, hadamard_columnwise=16, layout_rowwise="values",
                                                  layout_columnwise="gemm_a"), 2 + 0.5 + 2 / 32),
    "sr_h16_g": (lambda x: gemm_fp4.cast_mxfp4_dual(x, sr_key=SR, hadamard_columnwise=16, layout_rowwise="values",
                                                     layout_columnwise="gemm_a"), 2 + 0.5 + 2 / 32),
}
SHAPES = [(768, 192), (768, 768), (768, 2048), (16384, 192), (16384, 768), (16384, 1024), (16384, 2048),
          (16384, 4096)]


def timed(fn, xs):
    """Seconds per cast, each of 5 batches after 0.2 s of the program's own calls (jax_aiter.benchmark's timing)."""
    return timed_together({"cast": fn}, xs, batches=5, calls=10, per_call=len(xs), settle_s=0.2)["cast"]


res = {"label": label, "device": str(jax.devices()[0]), "rows": {}}
big = jnp.ones((1 << 30,), jnp.bfloat16)
copy_s = timed(jax.jit(lambda xs: [-x for x in xs]), [big])
res["copy_tb_s"] = copy_bw = 2 * big.nbytes / copy_s / 1e12
print(f"{label} copy {copy_bw:.2f} TB/s", flush=True)
del big
for m, k in SHAPES:
    xs = [jax.random.normal(jax.random.key(i), (m, k), jnp.float32).astype(jnp.bfloat16) for i in range(8)]
    for name, (f, written) in variants.items():
        t = timed(jax.jit(lambda xs, f=f: [f(x) for x in xs]), xs)
        fraction = m * k * (2 + written) / t / 1e12 / copy_bw
        res["rows"][f"{name} {m}x{k}"] = dict(us=t * 1e6, fraction_of_copy=fraction)
        print(f"{label} {name:9s} {m:5d}x{k:<5d}: {t * 1e6:7.1f} us  {fraction:.2f} of copy", flush=True)
json.dump(res, open(f"{out}/cast_ab_{label}.json", "w"), indent=1)
