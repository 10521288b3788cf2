"""Which form of the scaled float8 product does XLA rewrite to one cuBLASLt FP8 GEMM with a bf16 result (the scale
and the rounding into bf16 inside the GEMM), and how fast is gemm_fp8's fwd+bwd in it (issue 18: <= 0.70x BF16)?

One process, the bench's linear shape (M, N, K = 16384, 14336, 4096). Every linear has current scaling and
gemm_fp8's custom VJP structure (E4M3 x and W, E5M2 gradient, three GEMMs); they differ in the scale rule and in
how the product is written:
  gemm_fp8            main's op: exact scale amax/fmax, float8 dot with float32 results, scale after, convert to bf16
  pow2 bf16-result    power-of-two scales; float8 dot with bf16 results at HIGHEST, times the scale in bf16 (exact:
                      a power of two), the form of F8ScaleD in XLA's GEMM rewriter
  pow2 dequantized    power-of-two scales; float8 operands converted to bf16, the first times the scale, bf16 dot at
                      HIGHEST (the form measured on branch fp8-single-rounding, compiled to bf16 GEMMs there)
  pow2 dequantized DEFAULT   the same at DEFAULT precision (to see whether HIGHEST blocks the rewrite)
Prints each program's cuBLAS calls and result types; times the programs that have FP8 calls with the BF16 linear,
batches interleaved; writes the JSON. Run with TF_CPP_VMODULE=gemm_rewriter=1 to see the rewriter's reasons.

usage: python3 fp8_bf16_result_probe.py OUT_DIR [M N K]
"""

import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_aiter.benchmark import compile_fn, normal, timed_together
from jax_aiter.gemm_fp8 import gemm_fp8
from jax_aiter.ref import gemm_fp8 as ref

M, N, K = (int(v) for v in sys.argv[2:5]) if len(sys.argv) > 4 else (16384, 14336, 4096)


def pow2_cast(t, fmt):
    fmax = np.float32(ref.format_max(fmt))
    amax = jnp.max(jnp.abs(t)).astype(jnp.float32)
    s = jnp.ldexp(np.float32(1), jnp.frexp(amax)[1] - np.frexp(fmax)[1])
    s = jnp.where(amax > fmax * s, 2 * s, s)
    s = jnp.maximum(s, np.float32(2.0 ** -126))
    return jnp.clip(t.astype(jnp.float32) * (1 / s), -fmax, fmax).astype(fmt), s


def dims(contracting):
    return ((contracting[0],), (contracting[1],)), ((), ())


def bf16_result(qa, qb, scale, contracting):
    y = lax.dot_general(qa, qb, dims(contracting), precision=lax.Precision.HIGHEST,
                        preferred_element_type=jnp.bfloat16)
    return y * scale.astype(jnp.bfloat16)


def dequantized(precision):
    def product(qa, qb, scale, contracting):
        a = qa.astype(jnp.bfloat16) * scale.astype(jnp.bfloat16)
        return lax.dot_general(a, qb.astype(jnp.bfloat16), dims(contracting), precision=precision,
                               preferred_element_type=jnp.bfloat16)
    return product


def linear_of(product):
    @jax.custom_vjp
    def linear(x, w):
        return fwd(x, w)[0]

    def fwd(x, w):
        qx, sx = pow2_cast(x, ref.E4M3)
        qw, sw = pow2_cast(w, ref.E4M3)
        return product(qx, qw, sx * sw, (1, 1)), (qx, qw, sx, sw)

    def bwd(res, dy):
        qx, qw, sx, sw = res
        qg, sg = pow2_cast(dy, ref.E5M2)
        return product(qg, qw, sg * sw, (1, 0)), product(qg, qx, sg * sx, (0, 0))

    linear.defvjp(fwd, bwd)
    return linear


def fwd_bwd(fn):
    def program(a):
        y, vjp = jax.vjp(fn, a[0], a[1])
        return (y, *vjp(a[2]))
    return program


def cublas_calls(compiled) -> list[str]:
    calls = []
    for line in compiled.as_text().splitlines():
        if 'custom_call_target="__cublas' in line:
            m = re.search(r"= \(?(\w+\[[\d,]*\])", line)
            target = re.search(r'custom_call_target="([^"]+)"', line).group(1)
            calls.append(f"{target} -> {m.group(1) if m else '?'}")
    return calls


def relative_difference(a, b) -> float:
    a64, b64 = (np.asarray(t, np.float64) for t in (a, b))
    return float(np.max(np.abs(a64 - b64)) / np.max(np.abs(b64)))


def main(out_dir):
    x, w, dy = normal(jax.random.key(0), (M, K)), normal(jax.random.key(1), (N, K), 0.05), \
        normal(jax.random.key(2), (M, N))
    inputs = (x, w, dy)
    linears = {"bf16": lambda a, b: jnp.dot(a, b.T), "gemm_fp8": gemm_fp8,
               "pow2 bf16-result": linear_of(bf16_result),
               "pow2 dequantized": linear_of(dequantized(lax.Precision.HIGHEST)),
               "pow2 dequantized DEFAULT": linear_of(dequantized(lax.Precision.DEFAULT))}
    programs = {name: compile_fn(fwd_bwd(fn), inputs) for name, fn in linears.items()}
    calls = {name: cublas_calls(p) for name, p in programs.items()}
    for name, c in calls.items():
        print(name, "::", c, flush=True)
    timed = {name: p for name, p in programs.items()
             if name in ("bf16", "gemm_fp8") or any("f8" in c for c in calls[name])}
    values = {name: p(inputs) for name, p in timed.items()}
    apart = {name: {out: relative_difference(a, b) for out, a, b in
                    zip(("y", "dx", "dw"), v, values["gemm_fp8"], strict=True)}
             for name, v in values.items() if name not in ("bf16", "gemm_fp8")}
    print("relative to gemm_fp8:", apart, flush=True)
    times = timed_together(timed, inputs, batches=9, calls=3)
    report = {"shape": [M, N, K], "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "fwd_bwd_s": times, "over_bf16": {k: v / times["bf16"] for k, v in times.items()},
              "cublas_calls": calls, "relative_to_gemm_fp8": apart}
    for k, v in times.items():
        print(f"{k:26s} {v * 1e3:7.3f} ms  {v / times['bf16']:.3f}x bf16")
    with open(f"{out_dir}/fp8_bf16_result_probe.json", "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
